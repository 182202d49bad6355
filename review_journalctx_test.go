package idemretry_test

// the review of journalContext (landing.go) and renewLease's use of it:
// every journal call before sending ends with the caller's context or the
// journal timeout, whichever is first, and the error says which.

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

// noDoneContext reports a fixed deadline and no Done channel; its Err is
// Background's (nil): a Done that never closes has nothing to report.
type noDoneContext struct {
	context.Context
	dl time.Time
}

func (c noDoneContext) Deadline() (time.Time, bool) { return c.dl, true }
func (noDoneContext) Done() <-chan struct{}         { return nil }

// lyingDeadline has a working Done (and Err) but reports a deadline
// that is not the one its Done closes at.
type lyingDeadline struct {
	context.Context
	dl time.Time
}

func (c lyingDeadline) Deadline() (time.Time, bool) { return c.dl, true }

const journalCtxTimeout = 300 * time.Millisecond

func reserveUnder(t *testing.T, ctx context.Context) (took time.Duration, err error) {
	t.Helper()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
		idemretry.WithJournalTimeout(journalCtxTimeout))
	require.NoError(t, err)
	defer tr.Close()
	req := post(t, ctx, srv.URL, `{"amount":1}`)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("RoundTrip still waiting for the journal 20 s after a %v journal timeout", journalCtxTimeout)
	}
	require.Empty(t, srv.seen(), "sent without a reserved key")
	return time.Since(start), err
}

// The caller's context or the journal timeout, whichever first; the
// caller's own error when its context ended the wait, ErrUnavailable when
// the timeout did: for well-formed contexts.
//
// Found in the review of journalError (8fea022; was TestReviewJournalContextNormalContexts).
func TestJournalContextNormalContexts(t *testing.T) {
	slack := 3 * time.Second // a noisy 2-core machine
	t.Run("deadline before the timeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		took, err := reserveUnder(t, ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, journal.ErrUnavailable, "the caller's deadline reported as the journal's")
		require.Less(t, took, slack)
	})
	t.Run("deadline after the timeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		took, err := reserveUnder(t, ctx)
		require.ErrorIs(t, err, journal.ErrUnavailable)
		require.Less(t, took, slack)
	})
	t.Run("no deadline", func(t *testing.T) {
		took, err := reserveUnder(t, context.Background())
		require.ErrorIs(t, err, journal.ErrUnavailable)
		require.Less(t, took, slack)
	})
	t.Run("cancelled before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := reserveUnder(t, ctx)
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, journal.ErrUnavailable)
	})
	t.Run("cancelled during", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		took, err := reserveUnder(t, ctx)
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, journal.ErrUnavailable)
		require.Less(t, took, slack)
	})
	t.Run("deadline already passed", func(t *testing.T) {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		_, err := reserveUnder(t, ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, journal.ErrUnavailable)
	})
}

// A context with a deadline but no Done channel: bounded by the earlier of
// its deadline and the journal timeout, and labelled by which ended it.
//
// Found in the review of journalError (8fea022; was TestReviewJournalContextDeadlineButNoDone).
func TestJournalContextDeadlineButNoDone(t *testing.T) {
	slack := 3 * time.Second
	t.Run("deadline after the timeout", func(t *testing.T) {
		took, err := reserveUnder(t, noDoneContext{context.Background(), time.Now().Add(time.Hour)})
		require.ErrorIs(t, err, journal.ErrUnavailable)
		require.Less(t, took, slack)
	})
	t.Run("deadline already passed", func(t *testing.T) {
		took, err := reserveUnder(t, noDoneContext{context.Background(), time.Now().Add(-time.Second)})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, took, slack)
	})
	t.Run("deadline before the timeout", func(t *testing.T) {
		took, err := reserveUnder(t, noDoneContext{context.Background(), time.Now().Add(50 * time.Millisecond)})
		require.Less(t, took, slack)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// The journal answered nothing within 50 ms of a 300 ms timeout:
		// the caller's deadline ended the call, not the journal.
		require.NotErrorIs(t, err, journal.ErrUnavailable, "the caller's own deadline reported as journal.ErrUnavailable")
	})
}

// A context whose Done works but whose Deadline lies about a later end.
// (One whose Deadline reports an earlier end than its Done signals is not
// bounded by the journal timeout: a deadline before the timeout is trusted,
// as context.WithTimeout trusts it, to spare the request path a timer.)
//
// Found in the review of journalError (8fea022; was TestReviewJournalContextLyingDeadline).
func TestJournalContextLyingDeadline(t *testing.T) {
	t.Run("reports a far deadline, is cancelled early", func(t *testing.T) {
		base, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		took, err := reserveUnder(t, lyingDeadline{base, time.Now().Add(time.Hour)})
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, journal.ErrUnavailable)
		require.Less(t, took, 3*time.Second)
	})
}

// heldOutcomes is a blocking journal whose Update fails (mode 1) or hangs
// until its context ends (mode 2); it passes in mode 0.
type heldOutcomes struct {
	*journal.Memory
	mode atomic.Int32
}

func (j *heldOutcomes) Update(ctx context.Context, rec journal.Record) error {
	switch j.mode.Load() {
	case 1:
		return errors.New("disk full")
	case 2:
		<-ctx.Done()
		return ctx.Err()
	}
	return j.Memory.Update(ctx, rec)
}

// An outcome kept in memory (the journal refused it) is written before the
// action is reserved again; when that write is cut by the journal timeout,
// the caller's context still open and without a deadline, the error says
// the journal is unavailable, as for any journal call cut by it (README,
// "Errors": journal.ErrUnavailable when it did not answer in time).
//
// Found in the review of journalError (8fea022; was TestReviewLandOutcomeCutByJournalTimeoutIsUnavailable).
func TestLandOutcomeCutByJournalTimeoutIsUnavailable(t *testing.T) {
	srv := newPayServer(t)
	j := &heldOutcomes{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithJournalTimeout(journalCtxTimeout))
	require.NoError(t, err)
	defer tr.Close()
	ctx := idemretry.WithAction(context.Background(), "pay:rv-land")
	j.mode.Store(1)
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, srv.seen(), 1)

	j.mode.Store(2)
	start := time.Now()
	_, err = tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	require.Less(t, time.Since(start), 3*time.Second)
	require.Error(t, err)
	require.Len(t, srv.seen(), 1, "sent again while its outcome was not in the journal")
	require.ErrorIs(t, err, journal.ErrUnavailable, "a journal write cut by the journal timeout: %v", err)
	j.mode.Store(0) // let Close land it
}

// A lease renewal before an attempt (checkLease -> renewLease, now through
// journalContext) on a stalled journal ends within the journal timeout for
// a caller's context whose deadline is later, or that has none, and the
// action is sent all the same (a renewal that fails changes nothing).
//
// Found in the review of journalError (8fea022; was TestReviewLeaseRenewalBoundedForNormalContexts).
func TestLeaseRenewalBoundedForNormalContexts(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"no deadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		{"deadline after the timeout", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &stallingLeaser{Memory: journal.NewMemory()}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithLeaseTTL(time.Millisecond),
				idemretry.WithJournalTimeout(journalCtxTimeout))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:rv-lease"), srv.URL, `{"amount":1}`))
			require.NoError(t, err)
			resp.Body.Close()
			require.Less(t, time.Since(start), 5*time.Second)
			require.GreaterOrEqual(t, j.calls.Load(), int32(2), "the lease was never renewed: the test proves nothing")
			require.Len(t, srv.seen(), 1)
		})
	}
}
