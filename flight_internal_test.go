package idemretry

import (
	"context"
	"testing"
)

// A joiner whose context ends as its flight lands gets the flight's result,
// as a leader whose final answer arrives as its context ends does: the
// answer is in hand, and an error would make the app resend, for an
// unnamed request a second payment. When both are ready, wait must not
// pick at random.
func TestFlightWaitPrefersTheLandedResult(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f := &flight{done: make(chan struct{})}
	f.release()
	wrong := 0
	for range 200 {
		if err := f.wait(ctx); err != nil {
			wrong++
		}
	}
	if wrong > 0 {
		t.Fatalf("wait returned the context's error %d times in 200 with the flight landed", wrong)
	}
}

// FlightJoiners is how many callers wait in the flights of t's actions in
// the air: a test knows from it that a request has joined a flight.
func FlightJoiners(t *Transport) int {
	t.flights.mu.Lock()
	defer t.flights.mu.Unlock()
	n := 0
	for _, f := range t.flights.m {
		n += f.joiners
	}
	return n
}
