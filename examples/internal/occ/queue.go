package occ

// kind says what an event is: a message arriving at the server or back at a
// client. The server takes no time, so its answer is scheduled the moment
// a request arrives.
type kind uint8

const (
	readAtServer  kind = iota // a client's read request arrives
	readAtClient              // the read's answer (val = version) arrives
	writeAtServer             // a write (val = version read) arrives
	writeAtClient             // the write's answer (val = 1 on success) arrives
)

// An event is one message in flight. Each client has exactly one at a time.
type event struct {
	at     float64 // virtual time of arrival, ms
	seq    uint64  // breaks ties in time in scheduling order, so runs replay
	client int32
	kind   kind
	val    int64
}

// queue is a binary min-heap of events ordered by (at, seq). It is written
// out rather than built on container/heap so that the hot loop makes no
// interface calls or allocations: a full sweep pushes tens of millions.
type queue struct {
	ev  []event
	seq uint64
}

func (q *queue) reset() {
	q.ev = q.ev[:0]
	q.seq = 0
}

func (q *queue) len() int { return len(q.ev) }

func (q *queue) less(i, j int) bool {
	a, b := &q.ev[i], &q.ev[j]
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// push schedules e, stamping it with the next sequence number.
func (q *queue) push(e event) {
	e.seq = q.seq
	q.seq++
	q.ev = append(q.ev, e)
	i := len(q.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.ev[i], q.ev[p] = q.ev[p], q.ev[i]
		i = p
	}
}

// pop removes and returns the earliest event. The queue must not be empty.
func (q *queue) pop() event {
	top := q.ev[0]
	last := len(q.ev) - 1
	q.ev[0] = q.ev[last]
	q.ev = q.ev[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= last {
			break
		}
		m := l
		if r := l + 1; r < last && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q.ev[i], q.ev[m] = q.ev[m], q.ev[i]
		i = m
	}
	return top
}
