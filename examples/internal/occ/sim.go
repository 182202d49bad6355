package occ

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// One-way network delay: |Normal(HopMean, HopSD)| ms per hop, as in the
// reference. An attempt is four hops: read request, read answer, write
// request, write answer.
const (
	HopMean = 10.0
	HopSD   = 2.0
)

// Result is what one run of the model measures.
type Result struct {
	// Calls counts writes that reached the server, failed or not; reads
	// are free in the reference's accounting.
	Calls int
	// Time is when the last client received its successful write answer,
	// in ms from the start.
	Time float64
}

// A Sim runs the model. It keeps its buffers between runs so that a worker
// can run thousands of them without garbage; it is not safe for concurrent
// use, so give each goroutine its own.
type Sim struct {
	q        queue
	backoffs []backoff.BackOff
}

// Run simulates n clients updating the row once each under strategy st,
// drawing every random number from r. onCall, if not nil, is told the
// virtual time of every write that reaches the server.
func (s *Sim) Run(n int, st Strategy, r *rand.Rand, onCall func(at float64)) Result {
	hop := func() float64 { return math.Abs(HopMean + HopSD*r.NormFloat64()) }

	s.q.reset()
	s.backoffs = s.backoffs[:0]
	for i := 0; i < n; i++ {
		s.backoffs = append(s.backoffs, st.New(r))
		s.q.push(event{at: hop(), client: int32(i), kind: readAtServer})
	}

	var version int64 // the row's version, held by the server
	var res Result
	for s.q.len() > 0 {
		e := s.q.top()
		next := event{client: e.client}
		switch e.kind {
		case readAtServer:
			next.at, next.kind, next.val = e.at+hop(), readAtClient, version
		case readAtClient:
			next.at, next.kind, next.val = e.at+hop(), writeAtServer, e.val
		case writeAtServer:
			res.Calls++
			if onCall != nil {
				onCall(e.at)
			}
			next.at, next.kind = e.at+hop(), writeAtClient
			if e.val == version {
				version++
				next.val = 1
			}
		case writeAtClient:
			if e.val == 1 {
				// Done. Events leave in time order, so the last success
				// is the completion time.
				res.Time = e.at
				s.q.pop()
				continue
			}
			// The retry's read leaves after the backoff and then travels.
			wait := s.backoffs[e.client].NextBackOff()
			next.at, next.kind = e.at+hop()+ms(wait), readAtServer
		}
		// Every other event causes exactly one more for the same client.
		s.q.replaceTop(next)
	}
	return res
}

// ms converts a backoff's wait to the model's milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
