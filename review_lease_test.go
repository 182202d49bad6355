package idemretry_test

// the review's review of journalContext, journalError and landOutcome(ctx, jctx)
// (commits 4a9fe9e, 8fea022): what a caller waits for on the journal after
// its context has ended, and how the errors are labelled.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// hangingRelease is a Leaser over Memory that grants every lease and
// whose Release hangs until its context ends.
type hangingRelease struct {
	*journal.Memory
	releases atomic.Int32 // begun
	ended    atomic.Int32
}

func (j *hangingRelease) Lease(ctx context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return false, time.Time{}, err
	}
	return true, time.Now().Add(ttl), nil
}

func (j *hangingRelease) Release(ctx context.Context, _, _ string) error {
	j.releases.Add(1)
	defer j.ended.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// README, guarantee 5: the caller's wait ends with its context, plus
// OutcomeGrace for the outcome. The release of the action's lease (lead's
// deferred releaseLease) waited up to a second past the caller's context
// (issue 26, item 12): it runs after RoundTrip has returned, bounded by
// that second all the same (a release cut short leaves the lease held, and
// the next request of the action waiting for its TTL; see
// TestLeaseJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace), and
// Close waits for it, leaving no goroutine behind.
//
// Found in the review of leases (5a75ef1; was TestReviewLeaseReleaseBoundedAfterTheCallersContext).
func TestLeaseReleaseBoundedAfterTheCallersContext(t *testing.T) {
	srv := newSlowPayServer(t, 3*time.Second)
	j := &hangingRelease{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()
	ctx, cancel := context.WithCancel(idemretry.WithAction(context.Background(), "pay:rl-release"))
	defer cancel()
	cancelledAt := make(chan time.Time, 1)
	go func() {
		<-srv.arrived // the attempt is on the wire
		cancelledAt <- time.Now()
		cancel()
	}()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	returned := time.Now()
	ended := j.ended.Load()
	cancelled := <-cancelledAt
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, ended, "RoundTrip returned %v after its context was cancelled, once the lease's Release had ended: it waited for the release",
		returned.Sub(cancelled))
	closeStart := time.Now()
	require.NoError(t, tr.Close())
	require.Equal(t, int32(1), j.ended.Load(), "Close returned (after %v) before the Release under way ended", time.Since(closeStart))
	checkNoPackageGoroutines(t)
}

// Close's landAll now judges a write cut by the journal timeout against
// context.Background: the error says the journal is unavailable (README,
// "Errors"), and still unwraps to context.DeadlineExceeded.
//
// Found in the review of leases (5a75ef1; was TestReviewCloseLandingCutByJournalTimeoutIsUnavailable).
func TestCloseLandingCutByJournalTimeoutIsUnavailable(t *testing.T) {
	srv := newPayServer(t)
	j := &heldOutcomes{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithJournalTimeout(200*time.Millisecond))
	require.NoError(t, err)
	j.mode.Store(2) // Update hangs until its context ends
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rl-close"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	start := time.Now()
	err = tr.Close()
	require.Less(t, time.Since(start), 3*time.Second)
	require.ErrorIs(t, err, journal.ErrUnavailable, "Close: %v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Close: %v", err)
	require.False(t, errors.Is(err, context.Canceled), "Close: %v", err)
}

// leaseHeldElsewhere is a Leaser over Memory whose lease is held by another
// machine for an hour: the first Lease says so, and every later Lease
// hangs until its context ends (a journal that stalls while the caller
// waits for the lease).
type leaseHeldElsewhere struct {
	*journal.Memory
	leases atomic.Int32
}

func (j *leaseHeldElsewhere) Lease(ctx context.Context, _, _ string, _ time.Duration) (bool, time.Time, error) {
	if j.leases.Add(1) == 1 {
		return false, time.Now().Add(time.Hour), nil
	}
	<-ctx.Done()
	return false, time.Time{}, ctx.Err()
}

func (j *leaseHeldElsewhere) Release(context.Context, string, string) error { return nil }

func leaseWait(t *testing.T, ctx context.Context) (srv *payServer, j *leaseHeldElsewhere, took time.Duration, err error) {
	t.Helper()
	srv = newPayServer(t)
	j = &leaseHeldElsewhere{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithJournalTimeout(5*time.Second))
	require.NoError(t, err)
	defer tr.Close()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:rl-held"), srv.URL, `{"amount":1}`))
		if resp != nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("RoundTrip still waiting for the lease 20 s after its deadline")
	}
	return srv, j, time.Since(start), err
}

// README, "One machine in flight per action": a machine that finds the
// lease held waits; "If the caller's context ends first, it gets an
// *ActionError wrapping ErrLeaseHeld, with nothing sent." The caller's
// deadline ending a Lease call of that wait (rather than the sleep between
// two) is taken for a journal that could not lease: it is logged as such
// and the action goes on to its attempts "without a lease".
//
// Found in the review of leases (5a75ef1; was TestReviewLeaseWaitEndedByTheCallersDeadlineIsLeaseHeld).
func TestLeaseWaitEndedByTheCallersDeadlineIsLeaseHeld(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	srv, j, took, err := leaseWait(t, ctx)
	require.GreaterOrEqual(t, j.leases.Load(), int32(2), "no second Lease: the test proves nothing")
	require.Less(t, took, 5*time.Second)
	require.Empty(t, srv.seen(), "sent while another machine holds the lease")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, idemretry.ErrLeaseHeld, "the caller's deadline ended the wait for a lease held elsewhere: %v", err)
}

// The same with a context that reports a deadline but has no Done (the
// case 4a9fe9e bounds journal calls for): the Lease call is cut at the
// deadline by journalContext's own timer, that is taken for a journal that
// could not lease, and the action is sent, after its deadline, while
// another machine holds its lease.
//
// Found in the review of leases (5a75ef1; was TestReviewLeaseWaitOnADeadlineWithoutDoneSendsNothing).
func TestLeaseWaitOnADeadlineWithoutDoneSendsNothing(t *testing.T) {
	srv, j, took, err := leaseWait(t, noDoneContext{context.Background(), time.Now().Add(300 * time.Millisecond)})
	require.GreaterOrEqual(t, j.leases.Load(), int32(2), "no second Lease: the test proves nothing")
	require.Less(t, took, 5*time.Second)
	require.Empty(t, srv.seen(), "sent after the caller's deadline while another machine holds the lease")
	require.ErrorIs(t, err, context.DeadlineExceeded, "%v", err)
}

// hangingGet is a blocking journal whose Get hangs until its context
// ends.
type hangingGet struct{ *journal.Memory }

func (j hangingGet) Get(ctx context.Context, _ string) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// Resume's reads (reconcile's stillUnknown, through journalContext and
// journalError) on a context with a deadline and no Done: bounded by the
// earlier of the deadline and the journal timeout, and labelled by which
// ended them.
//
// Found in the review of leases (5a75ef1; was TestReviewResumeReadOnADeadlineWithoutDone).
func TestResumeReadOnADeadlineWithoutDone(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          time.Duration
		unavailable bool
	}{
		{"deadline before the timeout", 50 * time.Millisecond, false},
		{"deadline after the timeout", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := journal.NewMemory()
			old := journal.Record{ActionID: "pay:rl-old", Key: "k-rl-old", CreatedAt: time.Now().Add(-30 * time.Hour), State: journal.StatePending}
			_, _, err := m.Reserve(context.Background(), old, journal.ReuseAny)
			require.NoError(t, err)
			old.State = journal.StateUnknown
			require.NoError(t, m.Update(context.Background(), old))
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingGet{m}), idemretry.WithJournalTimeout(journalCtxTimeout))
			require.NoError(t, err)
			defer tr.Close()
			app := &appResumer{}
			start := time.Now()
			results, err := tr.Resume(noDoneContext{context.Background(), time.Now().Add(tc.in)}, app, 1)
			require.Less(t, time.Since(start), 3*time.Second)
			require.NoError(t, err)
			require.Len(t, results, 1)
			require.Empty(t, app.resolved)
			require.ErrorIs(t, results[0].Err, context.DeadlineExceeded)
			if tc.unavailable {
				require.ErrorIs(t, results[0].Err, journal.ErrUnavailable)
			} else {
				require.NotErrorIs(t, results[0].Err, journal.ErrUnavailable, "the caller's deadline reported as the journal's")
			}
		})
	}
}
