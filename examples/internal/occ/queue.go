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

// before is the heap's order: by time, then by scheduling order.
func before(a, b *event) bool {
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
		if !before(&e, &q.ev[p]) {
			break
		}
		q.ev[i] = q.ev[p]
		i = p
	}
	q.ev[i] = e
}

// top returns the earliest event without removing it. The queue must not
// be empty.
func (q *queue) top() event { return q.ev[0] }

// pop removes the earliest event.
func (q *queue) pop() {
	last := len(q.ev) - 1
	q.ev[0] = q.ev[last]
	q.ev = q.ev[:last]
	if last > 0 {
		q.down()
	}
}

// replaceTop removes the earliest event and schedules e, as pop then push
// would, at half the cost: almost every event the model handles causes
// exactly one more, and the heap is most of the model's time.
func (q *queue) replaceTop(e event) {
	e.seq = q.seq
	q.seq++
	q.ev[0] = e
	q.down()
}

// down moves the top event down to its place.
func (q *queue) down() {
	n := len(q.ev)
	e := q.ev[0]
	i := 0
	for {
		m := 2*i + 1
		if m >= n {
			break
		}
		if r := m + 1; r < n && before(&q.ev[r], &q.ev[m]) {
			m = r
		}
		if !before(&q.ev[m], &e) {
			break
		}
		q.ev[i] = q.ev[m]
		i = m
	}
	q.ev[i] = e
}
