package idemretry_test

// the review's review of 5a75ef1: reserveLeased's Lease errors on a caller's
// context that has ended, the lease wait's re-read, and a flight's joiner
// when its leader's Lease call is cut by the leader's own deadline.

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

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
