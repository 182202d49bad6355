package idemretry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// WithLeaseTTL: zero is the default, a negative value or one under a
// millisecond is refused by NewTransport.
func TestWithLeaseTTLValidated(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{-time.Second, time.Microsecond, time.Millisecond - 1} {
		_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithLeaseTTL(d))
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption, "WithLeaseTTL(%v)", d)
	}
	for _, d := range []time.Duration{0, time.Millisecond, idemretry.DefaultLeaseTTL} {
		tr, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithLeaseTTL(d))
		if assert.NoError(t, err, "WithLeaseTTL(%v)", d) {
			tr.Close()
		}
	}
}

// A journal that is no journal.Leaser (the in-memory one) changes nothing:
// two Transports sharing it send one action alongside each other, as
// before leases, and the server answers the second 409 while the first is
// in progress. No goroutine is left behind.
func TestNoLeaserSendsAsBefore(t *testing.T) {
	if _, ok := any(journal.NewMemory()).(journal.Leaser); ok {
		t.Fatal("journal.Memory is a Leaser: this test needs a journal that is not")
	}
	srv := newPayServer(t)
	srv.delay = 500 * time.Millisecond
	arrived := make(chan int, 10)
	srv.arrived = arrived
	j := journal.NewMemory()
	newTr := func() *idemretry.Transport {
		tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j), idemretry.WithMaxRetries(0),
			idemretry.WithLeaseTTL(time.Hour))
		require.NoError(t, err)
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	a, b := newTr(), newTr()
	ctx := idemretry.WithAction(context.Background(), "pay:1")
	resA := make(chan int, 1)
	go func() {
		resp, err := a.RoundTrip(post(t, ctx, srv.URL, "order-1"))
		if err != nil {
			resA <- 0
			return
		}
		resp.Body.Close()
		resA <- resp.StatusCode
	}()
	<-arrived
	// Wait until A's charge is in progress at the server (arrived is sent
	// before the server marks the key in flight).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if srv.charging() {
			break
		}
	}
	resp, err := b.RoundTrip(post(t, ctx, srv.URL, "order-1"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "B, sent alongside A")
	assert.True(t, errors.Is(idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted))
	assert.Equal(t, http.StatusCreated, <-resA)
	srv.requireOnePayment(t, 2)
	a.Close()
	b.Close()
	checkNoPackageGoroutines(t)
}

// A RoundTrip still in flight when Close is called releases its lease on
// its own path once it ends (bounded by its context and a second): Close
// has stopped waiting for releases, and none runs in a goroutine that
// outlives the Transport.
func TestLeaseReleaseAfterCloseLeavesNoGoroutine(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	j := &hangingRelease{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:after-close"), srv.URL, `{"amount":1}`))
	<-srv.arrived
	require.NoError(t, tr.Close())
	require.NoError(t, <-res)
	require.Equal(t, int32(1), j.ended.Load(), "RoundTrip returned after Close before its release ended")
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// the review's review of 5a75ef1: reserveLeased's Lease errors on a caller's
// context that has ended, the lease wait's re-read, and a flight's joiner
// when its leader's Lease call is cut by the leader's own deadline.

// firstLeaseHangs is a Leaser over Memory whose first Lease says it
// started (entered) and hangs until its context ends; every later Lease
// is granted.
type firstLeaseHangs struct {
	*journal.Memory
	entered chan struct{}
	leases  atomic.Int32
}

func (j *firstLeaseHangs) Lease(ctx context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	if j.leases.Add(1) == 1 {
		close(j.entered)
		<-ctx.Done()
		return false, time.Time{}, ctx.Err()
	}
	return true, time.Now().Add(ttl), nil
}

func (j *firstLeaseHangs) Release(context.Context, string, string) error { return nil }

// A flight's joiner carries the action on when the leader's own context
// ended it (lead's cutShort: "a waiting caller carries it on instead").
// The leader's Lease call is cut by its deadline; the joiner, whose
// context is fine, must then lease and send, also when the leader's
// context has a deadline and no Done (which its Err cannot report: cutShort
// asks callerEnded).
//
// Found in the second review of leases (5062b32; was TestReviewJoinerCarriesOnWhenTheLeadersLeaseIsCutByItsDeadline).
func TestLeaseJoinerCarriesOnWhenTheLeadersLeaseIsCutByItsDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range deadlineContexts(time.Second) {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &firstLeaseHangs{Memory: journal.NewMemory(), entered: make(chan struct{})}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			lctx, cancel := tc.ctx()
			defer cancel()
			leader := sendAsync(tr, post(t, idemretry.WithAction(lctx, "pay:r3-join"), srv.URL, `{"amount":1}`))
			<-j.entered // the leader is in its Lease call
			var joinerResp *http.Response
			joinerErr := make(chan error, 1)
			go func() {
				resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:r3-join"), srv.URL, `{"amount":1}`))
				joinerResp = resp
				if resp != nil {
					resp.Body.Close()
				}
				joinerErr <- err
			}()
			var lerr error
			select {
			case lerr = <-leader:
			case <-time.After(20 * time.Second):
				t.Fatal("leader still running 20 s on")
			}
			require.Error(t, lerr, "the leader's deadline ended its Lease call")
			var jerr error
			select {
			case jerr = <-joinerErr:
			case <-time.After(20 * time.Second):
				t.Fatal("joiner still running 20 s on")
			}
			require.GreaterOrEqual(t, j.leases.Load(), int32(2), "the joiner did not lease the action: it did not carry it on (its error: %v)", jerr)
			require.NoError(t, jerr, "the joiner, whose context is fine, got the leader's error")
			require.Equal(t, http.StatusCreated, joinerResp.StatusCode)
			require.Len(t, srv.seen(), 1)
		})
	}
}

// leaseFails is a Leaser over Memory whose Lease fails at once with a
// journal error (not the caller's).
type leaseFails struct {
	*journal.Memory
	leases atomic.Int32
}

var errLeaseTable = errors.New("r3: relation \"idemretry_leases\" does not exist")

func (j *leaseFails) Lease(context.Context, string, string, time.Duration) (bool, time.Time, error) {
	j.leases.Add(1)
	return false, time.Time{}, errLeaseTable
}

func (j *leaseFails) Release(context.Context, string, string) error { return nil }

// WithLeaseTTL: "a Lease call that fails is logged at Warn and the action
// is sent without one" — while the caller's context is fine, whatever
// kind it is.
//
// Found in the second review of leases (5062b32; was TestReviewFailingLeaseStillSendsWhileTheCallerIsFine).
func TestLeaseFailingStillSendsWhileTheCallerIsFine(t *testing.T) {
	t.Parallel()
	for _, tc := range healthyContexts(time.Minute) {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &leaseFails{Memory: journal.NewMemory()}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:r3-fails"), srv.URL, `{"amount":1}`))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, int32(1), j.leases.Load())
			require.Len(t, srv.seen(), 1)
		})
	}
}

// leaseHangs is a Leaser over Memory whose Lease says it started and
// hangs until its context ends.
type leaseHangs struct {
	*journal.Memory
	entered chan struct{}
}

func (j *leaseHangs) Lease(ctx context.Context, _, _ string, _ time.Duration) (bool, time.Time, error) {
	select {
	case j.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return false, time.Time{}, ctx.Err()
}

func (j *leaseHangs) Release(context.Context, string, string) error { return nil }

// A Lease call (not a wait for another machine) that the caller's context
// ends: an *ActionError, no ErrLeaseHeld, the context's error, not
// ErrUnavailable, nothing sent, and its message says so.
//
// Found in the second review of leases (5062b32; was TestReviewLeaseCutByTheCallerWithoutWaiting).
func TestLeaseCutByTheCallerWithoutWaiting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancelled", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, context.Canceled},
		{"WithTimeout", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded},
		{"deadline without Done", func() (context.Context, context.CancelFunc) {
			return noDoneContext{context.Background(), time.Now().Add(300 * time.Millisecond)}, func() {}
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &leaseHangs{Memory: journal.NewMemory(), entered: make(chan struct{}, 1)}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			done := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:r3-cut"), srv.URL, `{"amount":1}`))
			<-j.entered
			if tc.want == context.Canceled {
				cancel()
			}
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("RoundTrip still running 20 s on")
			}
			require.Empty(t, srv.seen(), "sent after the caller's context ended")
			var ae *idemretry.ActionError
			require.ErrorAs(t, err, &ae)
			require.ErrorIs(t, err, tc.want)
			require.NotErrorIs(t, err, idemretry.ErrLeaseHeld)
			require.NotErrorIs(t, err, journal.ErrUnavailable)
			require.Nil(t, ae.Reason)
			require.Zero(t, ae.Attempts)
			require.Contains(t, err.Error(), "nothing sent")
			require.Equal(t, 1, countPrefix(err.Error()), "%v", err)
		})
	}
}

func countPrefix(s string) int {
	n := 0
	for i := 0; i+len("idemretry: ") <= len(s); i++ {
		if s[i:i+len("idemretry: ")] == "idemretry: " {
			n++
		}
	}
	return n
}

// heldElsewhereReadHangs is a Leaser over Memory whose lease is held
// by another machine for an hour (Lease answers so at once); with
// hangReread, every Reserve after the first hangs until its context ends
// (the journal stalls while the caller waits for the lease).
type heldElsewhereReadHangs struct {
	*journal.Memory
	hangReread bool
	reserves   atomic.Int32
	leases     atomic.Int32
}

func (j *heldElsewhereReadHangs) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if j.reserves.Add(1) > 1 && j.hangReread {
		<-ctx.Done()
		return journal.Record{}, false, ctx.Err()
	}
	return j.Memory.Reserve(ctx, rec, mode)
}

func (j *heldElsewhereReadHangs) Lease(ctx context.Context, _, _ string, _ time.Duration) (bool, time.Time, error) {
	j.leases.Add(1)
	if err := ctx.Err(); err != nil {
		return false, time.Time{}, err
	}
	return false, time.Now().Add(time.Hour), nil
}

func (j *heldElsewhereReadHangs) Release(context.Context, string, string) error { return nil }

// README, "One machine in flight per action": a machine that finds the
// lease held waits; "If the caller's context ends first (also in the
// middle of a Lease call), it gets an *ActionError wrapping ErrLeaseHeld,
// with nothing sent." The wait reads the action again between two Lease
// calls; the caller's context ending during that read (a stalled journal;
// or, for a context with a deadline and no Done, the deadline passing in
// the sleep between two looks, which is capped at it) ends with
// ErrLeaseHeld too, and soon after the deadline.
//
// Found in the second review of leases (5062b32; was TestReviewLeaseWaitEndedDuringTheReReadIsLeaseHeld).
func TestLeaseWaitEndedDuringTheReReadIsLeaseHeld(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		ctx        func() (context.Context, context.CancelFunc)
		hangReread bool
	}{
		{"WithTimeout, re-read stalls", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, true},
		{"deadline without Done", func() (context.Context, context.CancelFunc) {
			return noDoneContext{context.Background(), time.Now().Add(300 * time.Millisecond)}, func() {}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &heldElsewhereReadHangs{Memory: journal.NewMemory(), hangReread: tc.hangReread}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			done := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:r3-reread"), srv.URL, `{"amount":1}`))
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("RoundTrip still running 20 s on")
			}
			require.GreaterOrEqual(t, j.reserves.Load(), int32(2), "no re-read: the test proves nothing")
			require.Empty(t, srv.seen(), "sent while another machine holds the lease")
			require.ErrorIs(t, err, context.DeadlineExceeded, "%v", err)
			var ae *idemretry.ActionError
			require.ErrorAs(t, err, &ae, "%v", err)
			require.ErrorIs(t, err, idemretry.ErrLeaseHeld, "the caller's deadline ended the wait for a lease held elsewhere: %v", err)
		})
	}
}

// healthyContexts are the kinds of caller's context that stay fine through
// a test: none, a deadline far off, and a far deadline without Done.
func healthyContexts(far time.Duration) []ctxCase {
	return append([]ctxCase{{"Background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }}},
		deadlineContexts(far)...)
}

// ctxCase is a caller's context of one kind, made fresh for each run.
type ctxCase struct {
	name string
	ctx  func() (context.Context, context.CancelFunc)
}

// deadlineContexts are the two kinds of context with a deadline d from
// when they are made: context.WithTimeout's, and one that reports the
// deadline with no Done channel to signal it (noDoneContext).
func deadlineContexts(d time.Duration) []ctxCase {
	return []ctxCase{
		{"WithTimeout", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), d)
		}},
		{"deadline without Done", func() (context.Context, context.CancelFunc) {
			return noDoneContext{context.Background(), time.Now().Add(d)}, func() {}
		}},
	}
}

// the review's review of journalContext, journalError and landOutcome(ctx, jctx)
// (commits 4a9fe9e, 8fea022): what a caller waits for on the journal after
// its context has ended, and how the errors are labelled.

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
	t.Parallel()
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
	t.Parallel()
	srv, j, took, err := leaseWait(t, noDoneContext{context.Background(), time.Now().Add(300 * time.Millisecond)})
	require.GreaterOrEqual(t, j.leases.Load(), int32(2), "no second Lease: the test proves nothing")
	require.Less(t, took, 5*time.Second)
	require.Empty(t, srv.seen(), "sent after the caller's deadline while another machine holds the lease")
	require.ErrorIs(t, err, context.DeadlineExceeded, "%v", err)
}

// the review's review of 5062b32: the lease wait's new check after its sleep.

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
	t.Parallel()
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

// The release of a lease at the end of a RoundTrip, and who waits for it
// (found by the review of 5a75ef1, which cut the release at OutcomeGrace).

// slowReleaseLeaser is a Leaser over Memory that keeps one lease per
// action as a database would (holder and end), and whose Release takes
// slow to complete (a database under load); a Release whose context ends
// first does not happen, as a cancelled query does not.
type slowReleaseLeaser struct {
	*journal.Memory
	slow time.Duration

	mu       sync.Mutex
	holder   map[string]string
	until    map[string]time.Time
	released atomic.Int32
	cut      atomic.Int32
}

func (j *slowReleaseLeaser) Lease(ctx context.Context, id, holder string, ttl time.Duration) (bool, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return false, time.Time{}, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	if h, ok := j.holder[id]; ok && h != holder && now.Before(j.until[id]) {
		return false, j.until[id], nil
	}
	j.holder[id], j.until[id] = holder, now.Add(ttl)
	return true, j.until[id], nil
}

func (j *slowReleaseLeaser) Release(ctx context.Context, id, holder string) error {
	select {
	case <-time.After(j.slow):
	case <-ctx.Done():
		j.cut.Add(1)
		return ctx.Err()
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.holder[id] == holder {
		delete(j.holder, id)
		delete(j.until, id)
	}
	j.released.Add(1)
	return nil
}

// A leader cancelled while its attempt is on the wire: a joiner (this
// Transport, context fine) carries the action on. The leader's Release
// takes 400 ms, past OutcomeGrace but within the release's own second: it
// completes, so the joiner is not left waiting for its own Transport's
// lease to end (the TTL, 30 s by default) as if another machine held it.
//
// Found in the second review of leases (5062b32; was TestReviewJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace).
func TestLeaseJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace(t *testing.T) {
	t.Parallel()
	joinerCarriesOn(t, 400*time.Millisecond)
}

// The same when the leader's Release never completes (its second runs out:
// a database that is down): the lease stays held in the journal, by the
// leader's holder, for its TTL (30 s). The joiner, in the same Transport,
// re-enters it instead of waiting for it as for another machine's (issue
// 26, item 13).
func TestLeaseJoinerReentersALeaseWhoseReleaseFailed(t *testing.T) {
	t.Parallel()
	joinerCarriesOn(t, time.Hour)
}

// joinerCarriesOn: a leader cancelled while its attempt is on the wire,
// whose Release takes slow, and a joiner of its flight that carries the
// action on (see TestLeaseJoinerWaitsForItsOwnTransportsReleaseCutByOutcomeGrace).
func joinerCarriesOn(t *testing.T, slow time.Duration) {
	srv := newSlowPayServer(t, 2*time.Second)
	j := &slowReleaseLeaser{Memory: journal.NewMemory(), slow: slow,
		holder: map[string]string{}, until: map[string]time.Time{}}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()
	lctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader := sendAsync(tr, post(t, idemretry.WithAction(lctx, "pay:r3-own"), srv.URL, `{"amount":1}`))
	<-srv.arrived // the leader's attempt is on the wire
	// Time for the joiner's retries of the 409 the server answers while the
	// leader's charge runs (2 s), on a loaded machine; well short of the
	// lease's TTL (30 s), which the joiner would wait for with the bug.
	jctx, jcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer jcancel()
	var jresp *http.Response
	joiner := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(jctx, "pay:r3-own"), srv.URL, `{"amount":1}`))
		jresp = resp
		if resp != nil {
			resp.Body.Close()
		}
		joiner <- err
	}()
	time.Sleep(200 * time.Millisecond) // the joiner joins the flight
	cancel()
	require.ErrorIs(t, <-leader, context.Canceled)
	var jerr error
	select {
	case jerr = <-joiner:
	case <-time.After(25 * time.Second):
		t.Fatal("joiner still running 25 s on")
	}
	t.Logf("releases completed %d, cut %d", j.released.Load(), j.cut.Load())
	require.NoError(t, jerr, "the joiner, whose context is fine, waited for the lease of its own Transport's finished RoundTrip")
	require.Equal(t, http.StatusCreated, jresp.StatusCode)
}

// The release is still bounded while the caller's context is fine (no
// deadline, a far one, or a far one without Done): the journal timeout and
// 1 s, not the caller's deadline. It runs after RoundTrip has returned,
// and Close waits for it.
//
// Found in the second review of leases (5062b32; was TestReviewReleaseBoundedWhileTheCallerIsFine).
func TestLeaseReleaseBoundedWhileTheCallerIsFine(t *testing.T) {
	t.Parallel()
	for _, tc := range healthyContexts(time.Hour) {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &hangingRelease{Memory: journal.NewMemory()}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:r3-bounded"), srv.URL, `{"amount":1}`))
			took := time.Since(start)
			require.NoError(t, err)
			resp.Body.Close()
			require.Zero(t, j.ended.Load(), "RoundTrip returned (after %v) once the release had ended", took)
			closeStart := time.Now()
			require.NoError(t, tr.Close())
			closed := time.Since(closeStart)
			require.Equal(t, int32(1), j.releases.Load())
			require.Equal(t, int32(1), j.ended.Load(), "Close returned before the release under way ended")
			require.Less(t, closed, 4*time.Second, "the release outlived its second")
		})
	}
}

// the review's review of 5a75ef1: a Lease that succeeds after the caller's
// deadline has passed.

// slowLeaseGranted is a Leaser over Memory whose Lease takes slow (a
// database under load that does not watch the context) and then grants
// the lease.
type slowLeaseGranted struct {
	*journal.Memory
	slow   time.Duration
	leases atomic.Int32
}

func (j *slowLeaseGranted) Lease(_ context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	j.leases.Add(1)
	time.Sleep(j.slow)
	return true, time.Now().Add(ttl), nil
}

func (j *slowLeaseGranted) Release(context.Context, string, string) error { return nil }

// 5a75ef1: "a Lease call the caller's context ended sends nothing". A
// Lease that returns held after the caller's deadline has passed: the
// action must not be sent after the deadline. With a context that has a
// deadline and no Done, nothing in net/http can see the deadline either.
//
// Found in the second review of leases (5062b32; was TestReviewLeaseGrantedAfterTheCallersDeadlineSendsNothing).
func TestLeaseGrantedAfterTheCallersDeadlineSendsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range deadlineContexts(200 * time.Millisecond) {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &slowLeaseGranted{Memory: journal.NewMemory(), slow: 500 * time.Millisecond}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			err = <-sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:r3-slowlease"), srv.URL, `{"amount":1}`))
			require.Equal(t, int32(1), j.leases.Load())
			require.Empty(t, srv.seen(), "sent after the caller's deadline (error: %v)", err)
			require.ErrorIs(t, err, context.DeadlineExceeded)
		})
	}
}

// slowReserve is a blocking journal whose Reserve takes slow (not
// watching its context) and then succeeds: no leases.
type slowReserve struct {
	*journal.Memory
	slow time.Duration
}

func (j slowReserve) Reserve(_ context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	time.Sleep(j.slow)
	return j.Memory.Reserve(context.Background(), rec, mode)
}

// The same without leases: a Reserve that succeeds after the deadline of a
// context without Done sends nothing either (attempts checks the deadline
// that nothing else can signal).
//
// Found in the second review of leases (5062b32; was TestReviewReserveAfterTheDeadlineWithoutDoneSendsNothing).
func TestReserveAfterTheDeadlineWithoutDoneSendsNothing(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(slowReserve{journal.NewMemory(), 500 * time.Millisecond}))
	require.NoError(t, err)
	defer tr.Close()
	ctx := noDoneContext{context.Background(), time.Now().Add(200 * time.Millisecond)}
	err = <-sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:r3-slowreserve"), srv.URL, `{"amount":1}`))
	require.Empty(t, srv.seen(), "sent after the caller's deadline (error: %v)", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
