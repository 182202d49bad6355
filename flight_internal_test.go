package idemretry

import (
	"context"
	"testing"

	"github.com/idemretry/idemretry/journal"
)

// A joiner whose context ends as its flight lands gets the flight's result,
// as a leader whose final answer arrives as its context ends does: the
// answer is in hand, and an error would make the app resend, for an
// unnamed request a second payment. When both are ready, wait must not
// pick at random.
func TestFlightWaitPrefersTheLandedResult(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var fs flights
	f, _, _ := fs.join("pay:1", journal.Fingerprint{1}, 0, true)
	fs.join("pay:1", journal.Fingerprint{1}, 0, true)
	fs.land(f)
	f.release()
	wrong := 0
	for range 200 {
		if err := fs.wait(ctx, f); err != nil {
			wrong++
		}
	}
	if wrong > 0 {
		t.Fatalf("wait returned the context's error %d times in 200 with the flight landed", wrong)
	}
}

// An id and its digest form name one action (a hashing journal lists it by
// its digest): whichever arrives first leads, and the other joins, in both
// orders; the flights then land and the next request leads anew.
func TestFlightsIDAndDigestShareOneFlight(t *testing.T) {
	t.Parallel()
	fp := journal.Fingerprint{1}
	for _, order := range [][2]string{{"pay:1", journal.Digest("pay:1")}, {journal.Digest("pay:1"), "pay:1"}} {
		var fs flights
		f, lead, _ := fs.join(order[0], fp, 0, true)
		if !lead {
			t.Fatalf("%q: first request does not lead", order[0])
		}
		g, lead, mismatch := fs.join(order[1], fp, 0, true)
		if lead || mismatch || g != f {
			t.Fatalf("%q after %q: lead %v, mismatch %v, same flight %v; want it to join", order[1], order[0], lead, mismatch, g == f)
		}
		if _, lead, _ := fs.join("pay:2", fp, 0, true); !lead {
			t.Fatal("another action joined pay:1's flight")
		}
		if _, lead, _ := fs.join(journal.Digest("pay:3"), fp, 0, true); !lead {
			t.Fatal("another action's digest joined a flight")
		}
		if n := fs.land(f); n != 1 {
			t.Fatalf("land: %d joiners, want 1", n)
		}
		if _, lead, _ := fs.join(order[1], fp, 0, true); !lead {
			t.Fatalf("%q after the flight landed: does not lead", order[1])
		}
	}
}

// A request with the same id and another fingerprint cannot join, whether
// it names the action by its id or its digest.
func TestFlightsDigestMismatch(t *testing.T) {
	t.Parallel()
	var fs flights
	fs.join("pay:1", journal.Fingerprint{1}, 0, true)
	if _, _, mismatch := fs.join(journal.Digest("pay:1"), journal.Fingerprint{2}, 0, true); !mismatch {
		t.Fatal("a digest with another fingerprint joined")
	}
}

// A hop flight that landed (its done recorded) with a joiner not yet
// decided has a flight going on from it under the hop id, which nobody
// leads: the hop is not in the air (inAir), or hopUnfinished would call a
// done 307's hop unfinished. Found in the review of the flight that goes on
// from a landed one.
func TestFlightsLandedHopIsNotInTheAir(t *testing.T) {
	var fs flights
	const prefix = keyActionPrefix + "K" + redirectActionInfix
	id := prefix + "x"
	var fp journal.Fingerprint
	f, lead, _ := fs.join(id, fp, 0, true)
	if !lead {
		t.Fatal("not leading")
	}
	if _, lead, _ := fs.join(id, fp, 0, true); lead {
		t.Fatal("joiner leads")
	}
	fs.land(f)
	if fs.inAir(prefix) {
		t.Errorf("the hop landed, its done recorded, and inAir still reports it in flight (placeholder %+v)", fs.m[id].leaderless)
	}
	fs.decide(f)
	if fs.inAir(prefix) {
		t.Errorf("still in air after its joiner decided")
	}
}
