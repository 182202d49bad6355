package occ

import (
	"math/rand/v2"
	"testing"
)

// The heap must hand events back by time, and in scheduling order on equal
// times, or runs would not replay.
func TestQueueOrdersByTimeThenSequence(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var q queue
	for i := range 1000 {
		// Few distinct times, so many ties.
		q.push(event{at: float64(r.IntN(20)), val: int64(i)})
	}
	// Interleave replaceTop with pops, as the model does.
	prev := q.top()
	q.replaceTop(event{at: prev.at + 5, val: 1000})
	prev = q.top()
	q.pop()
	for q.len() > 0 {
		e := q.top()
		q.pop()
		if e.at < prev.at || (e.at == prev.at && e.seq < prev.seq) {
			t.Fatalf("popped (%v, %d) after (%v, %d)", e.at, e.seq, prev.at, prev.seq)
		}
		if e.seq != uint64(e.val) && e.val != 1000 {
			t.Fatalf("event %d got sequence %d", e.val, e.seq)
		}
		prev = e
	}
}
