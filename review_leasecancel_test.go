package idemretry_test

// the review's review of 5062b32: the lease wait's new check after its sleep.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// alwaysHeld is a Leaser over Memory whose lease is always held by
// another machine, ending at once (so the wait sleeps about 1 ms a time).
type alwaysHeld struct{ *journal.Memory }

func (alwaysHeld) Lease(ctx context.Context, _, _ string, _ time.Duration) (bool, time.Time, error) {
	return false, time.Now(), nil
}

func (alwaysHeld) Release(context.Context, string, string) error { return nil }

// A caller that cancels its context (context.WithCancel, no deadline)
// while the lease wait runs must get an error that says so:
// errors.Is(err, context.Canceled). reserveLeased's new check after the
// sleep (callerEnded) reports context.DeadlineExceeded whatever ended the
// context, so a cancel that lands as the sleep's timer fires (sleepReal's
// select picks the timer, or the cancel comes between its return and the
// check) is reported as a deadline the caller never had.
//
// Found in the review of the lease wait (de94a0c; was TestReviewLeaseWaitCancelIsReportedAsCanceled).
func TestLeaseWaitCancelIsReportedAsCanceled(t *testing.T) {
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(alwaysHeld{journal.NewMemory()}))
	require.NoError(t, err)
	defer tr.Close()
	bad := 0
	var first error
	for i := range 400 {
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(time.Duration(rand.N(3000))*time.Microsecond, cancel)
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, fmt.Sprintf("pay:r4-%d", i)), srv.URL, `{"amount":1}`))
		if resp != nil {
			resp.Body.Close()
		}
		stop.Stop()
		cancel()
		require.Error(t, err)
		if !errors.Is(err, context.Canceled) {
			bad++
			if first == nil {
				first = err
			}
		}
	}
	require.Zero(t, len(srv.seen()), "nothing is sent while the lease is held")
	require.Zero(t, bad, "of 400 cancelled lease waits, %d did not report context.Canceled; first: %v", bad, first)
}

// A request whose context has a deadline, already past, and no Done
// channel sends nothing (attempts' new check) and says so: a
// context.DeadlineExceeded, 0 attempts, not maybe processed. The same
// action sent again with a working context is sent once, under the same
// key, and succeeds.
//
// Found in the review of the lease wait (de94a0c; was TestReviewPastNoDoneDeadlineThenRetry).
func TestPastNoDoneDeadlineSendsNothingThenRetry(t *testing.T) {
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(journal.NewMemory()))
	require.NoError(t, err)
	defer tr.Close()
	ctx := noDoneContext{context.Background(), time.Now().Add(-time.Millisecond)}
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:r4-late"), srv.URL, `{"amount":1}`))
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.Zero(t, ae.Attempts)
	require.False(t, ae.MaybeProcessed)
	require.Empty(t, srv.seen())
	resp, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:r4-late"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	resp.Body.Close()
	srv.requireOnePayment(t, 1)
}
