package sqljournal_test

// the review's review of 5a75ef1: a lease's release, now cut OutcomeGrace after
// the caller's context, on PostgreSQL whose row is briefly locked.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
)

// A payment cancelled by its caller while on the wire, while the
// action's row is locked for 500 ms (a concurrent transaction: real
// database load): the Release at the end of the RoundTrip waits for the
// lock, for up to its own second (5a75ef1 cut it at OutcomeGrace, 250 ms,
// and the lease then stayed held by that finished RoundTrip). The app's
// resend of the same action through the same Transport must not wait for
// it as for another machine's, for the whole TTL (30 s), nor fail with
// ErrLeaseHeld: it is answered within its 5 s deadline, one charge.
func TestReviewResendAfterCancelWaitsForOwnLeaseWhenReleaseIsCut(t *testing.T) {
	probe := testDB(t)
	j, table := openJournal(t, probe)
	srv := newUnstartedChargeServer(t)
	inCharge := make(chan struct{}, 1)
	finish := make(chan struct{})
	srv.process = func(n int, _ *http.Request) {
		if n == 1 {
			inCharge <- struct{}{}
			<-finish
		}
	}
	srv.Start()
	defer func() {
		select {
		case <-finish:
		default:
			close(finish)
		}
	}()
	tr := transportOn(t, j)

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan payment, 1)
	go func() { first <- post(ctx, tr, srv.URL, "pay:r3-resend", `{"amount":1}`) }()
	select {
	case <-inCharge:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the server")
	}
	tx, err := holdLock(testDB(t), lockRows(table))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	unlocked := make(chan error, 1)
	go func() {
		time.Sleep(700 * time.Millisecond)
		unlocked <- tx.Rollback()
	}()
	p1 := <-first
	if !errors.Is(p1.err, context.Canceled) {
		t.Fatalf("first: %+v, want context.Canceled", p1)
	}
	if err := <-unlocked; err != nil {
		t.Fatal(err)
	}
	close(finish)
	h, left := leaseOf(t, probe, table, "pay:r3-resend")
	t.Logf("after the first RoundTrip returned and the lock ended: lease holder %q, %v left", h, left)

	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	start := time.Now()
	p2 := post(rctx, tr, srv.URL, "pay:r3-resend", `{"amount":1}`)
	t.Logf("resend: %+v after %v; journal: %+v", p2, time.Since(start), rowsOf(t, probe, table))
	if errors.Is(p2.err, idemretry.ErrLeaseHeld) {
		t.Fatalf("the resend through the same Transport waited for the lease of its own finished RoundTrip: %v", p2.err)
	}
	if p2.err != nil || p2.status != http.StatusOK {
		t.Fatalf("the resend through the same Transport: %v; want the charge's answer (the first RoundTrip is over, no other machine holds the action)", p2.err)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("%d charges", n)
	}
}
