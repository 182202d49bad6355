package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// ctxSpy is a Memory journal (whose NeverBlocks claim it does not pass on)
// that notes, for each Reserve and Update, the deadline its context
// reported, when it was called, and the value under spyKey.
type ctxSpy struct {
	*journal.Memory
	mu    sync.Mutex
	calls []spiedCall
}

type spiedCall struct {
	op       string
	at       time.Time
	deadline time.Time
	hasDL    bool
	value    any
}

type spyKey struct{}

func (s *ctxSpy) note(ctx context.Context, op string) {
	dl, ok := ctx.Deadline()
	s.mu.Lock()
	s.calls = append(s.calls, spiedCall{op: op, at: time.Now(), deadline: dl, hasDL: ok, value: ctx.Value(spyKey{})})
	s.mu.Unlock()
}

func (s *ctxSpy) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	s.note(ctx, "reserve")
	return s.Memory.Reserve(ctx, rec, mode)
}

func (s *ctxSpy) Update(ctx context.Context, rec journal.Record) error {
	s.note(ctx, "update")
	return s.Memory.Update(ctx, rec)
}

// A request whose context has neither a deadline nor a Done channel gets
// shared journal bounds (one timer for the calls made within a hundredth of
// the journal timeout): each journal call still sees the caller's values,
// and a deadline no later than the journal timeout from its start and no
// earlier than 99 % of it.
func TestSharedJournalBoundKeepsValuesAndTheTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 10 * time.Second
	srv := newPayServer(t)
	spy := &ctxSpy{Memory: journal.NewMemory()}
	tr := transportOver(t, spy, idemretry.WithJournalTimeout(timeout))
	ctx := context.WithValue(context.Background(), spyKey{}, "trace-7")
	for i, body := range []string{`{"amount":1}`, `{"amount":2}`} {
		start := time.Now()
		roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:spied-"+body), srv.URL, body))
		end := time.Now()
		spy.mu.Lock()
		calls := spy.calls
		spy.calls = nil
		spy.mu.Unlock()
		var ops []string
		for _, c := range calls {
			ops = append(ops, c.op)
			require.Equal(t, "trace-7", c.value, "action %d: %s lost the caller's value", i, c.op)
			require.True(t, c.hasDL, "action %d: %s has no deadline", i, c.op)
			require.False(t, c.deadline.After(c.at.Add(timeout)), "action %d: %s bounded past the journal timeout", i, c.op)
			require.False(t, c.deadline.Before(start.Add(timeout-timeout/100)), "action %d: %s cut more than 1%% short", i, c.op)
			require.False(t, c.deadline.After(end.Add(timeout)), "action %d: %s", i, c.op)
		}
		require.Contains(t, ops, "reserve")
		require.Contains(t, ops, "update")
	}
	require.Equal(t, 2, srv.chargeCount())
}

// An outcome write that hangs, under a caller's context.Background, is cut
// by the journal timeout through its shared bound: RoundTrip returns the
// answer, the outcome is kept in memory, and Close lands it.
func TestSharedJournalBoundCutsAHangingOutcomeWrite(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	j := &flakyJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(200*time.Millisecond))
	j.hang.Store(true)
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":8}`))
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	resp.Body.Close()
	require.Less(t, took, 20*time.Second, "RoundTrip waited %v on a journal timeout of 200 ms", took)
	j.hang.Store(false)
	require.NoError(t, tr.Close(), "Close lands the outcome the journal did not take in time")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Empty(t, un)
	require.Equal(t, 1, srv.chargeCount())
}

// journalContext makes no timer of its own when the caller's deadline comes
// first: the journal call is then bounded by that deadline (the caller's
// own end, not an unavailable journal), and otherwise still by the journal
// timeout (journal.ErrUnavailable), both with nothing sent (guarantee 5).
func TestJournalCallBoundedByTheEarlierOfDeadlineAndTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		deadline, timeout time.Duration
		want              error
	}{
		{"deadline first", 300 * time.Millisecond, time.Minute, context.DeadlineExceeded},
		{"timeout first", time.Minute, 300 * time.Millisecond, journal.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
				idemretry.WithJournalTimeout(tc.timeout))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			_, err = tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:bounded"), srv.URL, `{"amount":1}`))
			elapsed := time.Since(start)
			require.ErrorIs(t, err, tc.want)
			if tc.want == context.DeadlineExceeded {
				require.NotErrorIs(t, err, journal.ErrUnavailable)
			}
			require.Less(t, elapsed, 20*time.Second)
			require.Empty(t, srv.seen())
		})
	}
}

// stallingMemory embeds a Memory, and so its NeverBlocks method, but its
// Reserve stalls until its context ends: the claim that a Memory never
// blocks must not pass to it, or the journal timeout would not bound it.
type stallingMemory struct{ *journal.Memory }

func (s stallingMemory) Reserve(ctx context.Context, _ journal.Record, _ journal.ReserveMode) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// The journal timeout bounds a journal that embeds journal.Memory: the
// Transport skips its timers only for a journal that says of itself that
// it never blocks (journal.NonBlocker), never for one that inherits the
// method.
func TestNonBlockerClaimIsNotInherited(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(stallingMemory{journal.NewMemory()}),
		idemretry.WithJournalTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, journal.ErrUnavailable) {
			t.Fatalf("RoundTrip: %v, want journal.ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RoundTrip still waiting for the stalled journal 30 s after a 50 ms journal timeout")
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests sent without a reserved key", n)
	}
}

// hangingReserve is a journal whose Reserve hangs until its context ends.
type hangingReserve struct{ *journal.Memory }

func (h hangingReserve) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// A journal that does not answer within the journal timeout is reported as
// unavailable, and nothing is sent.
func TestJournalTimeoutIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
		idemretry.WithJournalTimeout(100*time.Millisecond))
	require.NoError(t, err)
	defer tr.Close()
	start := time.Now()
	_, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	assert.ErrorIs(t, err, journal.ErrUnavailable)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Empty(t, srv.seen())
	_, err = idemretry.NewTransport(nil, inMemory(), idemretry.WithJournalTimeout(0))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
}

// deadlineWithoutDone is a broken context: it reports a deadline but no
// Done channel, so nothing ever tells a wait on it that the deadline came.
type deadlineWithoutDone struct{ context.Context }

func (deadlineWithoutDone) Deadline() (time.Time, bool) {
	return time.Now().Add(50 * time.Millisecond), true
}
func (deadlineWithoutDone) Done() <-chan struct{} { return nil }

// A journal call is bounded by the journal timeout even when the caller's
// context claims an earlier deadline it cannot signal (Done is nil): the
// deadline stands in for the journal timeout only when it can end the call.
func TestJournalTimeoutBoundsAContextWithADeadlineButNoDone(t *testing.T) {
	t.Parallel()
	_, err := reserveUnder(t, deadlineWithoutDone{context.Background()})
	require.ErrorIs(t, err, journal.ErrUnavailable)
}

// stallingLeaser is a Memory journal whose first Lease is granted (after
// 2 ms, so that the lease is due for renewal by the first attempt) and
// whose renewals stall until their context ends.
type stallingLeaser struct {
	*journal.Memory
	calls atomic.Int32
}

func (l *stallingLeaser) Lease(ctx context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	if l.calls.Add(1) == 1 {
		time.Sleep(2 * time.Millisecond)
		return true, time.Now().Add(ttl), nil
	}
	<-ctx.Done()
	return false, time.Time{}, ctx.Err()
}

func (l *stallingLeaser) Release(context.Context, string, string) error { return nil }

// The renewal of a lease before an attempt is bounded like any journal
// call: a caller's context that reports a deadline but has no Done channel
// does not leave it waiting on a stalled journal.
func TestLeaseRenewalBoundsAContextWithADeadlineButNoDone(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	j := &stallingLeaser{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithLeaseTTL(time.Millisecond),
		idemretry.WithJournalTimeout(300*time.Millisecond))
	require.NoError(t, err)
	defer tr.Close()
	done := make(chan error, 1)
	go func() {
		ctx := idemretry.WithAction(deadlineWithoutDone{context.Background()}, "pay:lease")
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("RoundTrip still waiting for the lease's renewal 20 s after a 300 ms journal timeout")
	}
	require.GreaterOrEqual(t, j.calls.Load(), int32(2), "the lease was never renewed: the test proves nothing")
	require.Len(t, srv.seen(), 1)
}

// remoteJournal is a Memory journal whose Reserve first asks a journal
// service over HTTP, with the call's context, as a journal that is a
// client of a remote store does; the service can hang.
type remoteJournal struct {
	*journal.Memory
	url    string
	client *http.Client
}

func (j *remoteJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.url, nil)
	if err != nil {
		return journal.Record{}, false, err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return journal.Record{}, false, err
	}
	resp.Body.Close()
	return j.Memory.Reserve(ctx, rec, mode)
}

// A caller's context that never ends, but whose values come from a request
// context that has ended (an app's own detached context), gets the journal
// timeout's shared bound. A journal call cut by that bound must be seen as
// the journal being unavailable (journal.ErrUnavailable, nothing sent),
// not as the caller's cancellation: the journal's HTTP client reports
// context.Cause of its request, which must be the timeout's, not the
// cause the ended request context left in the values.
func TestSharedBoundCauseIsTheTimeoutsUnderADetachedContext(t *testing.T) {
	t.Parallel()
	hung := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	pay := newPayServer(t)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	j := &remoteJournal{Memory: journal.NewMemory(), url: hung.URL, client: client}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(200*time.Millisecond))

	reqCtx, cancel := context.WithCancel(context.Background())
	cancel() // the request that started the work has ended
	ctx := detachedContext{parent: reqCtx}

	start := time.Now()
	err := sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:detached"), pay.URL, `{"amount":3}`))
	took := time.Since(start)
	require.Error(t, err)
	require.Less(t, took, 20*time.Second, "the journal call outlasted its 200 ms timeout: %v", took)
	require.ErrorIs(t, err, journal.ErrUnavailable, "a journal call cut by the journal timeout is reported as %v", err)
	require.False(t, errors.Is(err, context.Canceled), "the caller's context was not cancelled, yet: %v", err)
	require.Equal(t, 0, pay.chargeCount(), "sent although the journal did not reserve the key")
}

// the review of journalContext (landing.go) and renewLease's use of it:
// every journal call before sending ends with the caller's context or the
// journal timeout, whichever is first, and the error says which.

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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// Close's landAll now judges a write cut by the journal timeout against
// context.Background: the error says the journal is unavailable (README,
// "Errors"), and still unwraps to context.DeadlineExceeded.
//
// Found in the review of leases (5a75ef1; was TestReviewCloseLandingCutByJournalTimeoutIsUnavailable).
func TestCloseLandingCutByJournalTimeoutIsUnavailable(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
