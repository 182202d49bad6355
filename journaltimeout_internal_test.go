package idemretry

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Calls that start within a hundredth of the timeout share one timer's
// context; a call after that gets a new one, as does one with another
// timeout.
func TestSharedTimeoutsShareWithinTheSlack(t *testing.T) {
	t.Parallel()
	var s sharedTimeouts
	a := s.bound(context.Background(), time.Hour)
	b := s.bound(context.Background(), time.Hour)
	require.Equal(t, a.Done(), b.Done(), "two calls at once made two timers")
	c := s.bound(context.Background(), 2*time.Hour)
	require.NotEqual(t, a.Done(), c.Done(), "another timeout shared the first's timer")

	s.cur.Load().reuseUntil = time.Now().Add(-time.Nanosecond) // the slack has passed
	d := s.bound(context.Background(), 2*time.Hour)
	require.NotEqual(t, c.Done(), d.Done(), "a call after the slack shared an old timer")
}

// A shared bound ends at its deadline, with context.DeadlineExceeded, and
// so does a context a journal derives from it; deriving one starts no
// goroutine of the context package (boundContext's Value leads it to the
// shared timer's own cancelCtx, of which it becomes a child).
func TestSharedBoundEndsAndLinksDerivedContexts(t *testing.T) {
	var s sharedTimeouts
	b := s.bound(context.Background(), timeoutShareMin)
	before := runtime.NumGoroutine()
	var cancels []context.CancelFunc
	for range 100 {
		_, cancel := context.WithCancel(b)
		cancels = append(cancels, cancel)
	}
	grew := runtime.NumGoroutine() - before
	derived, cancel := context.WithCancel(b)
	defer cancel()
	for _, c := range cancels {
		c()
	}
	require.Less(t, grew, 50, "deriving 100 contexts from a shared bound started %d goroutines", grew)
	select {
	case <-derived.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a context derived from a 100 ms shared bound did not end in 30 s")
	}
	require.ErrorIs(t, b.Err(), context.DeadlineExceeded)
	require.ErrorIs(t, context.Cause(b), context.DeadlineExceeded)
	require.ErrorIs(t, derived.Err(), context.DeadlineExceeded) // the parent's reason, as under a WithTimeout
}

// detachedParent is a context of an app's own type that detaches a request's:
// it never ends, but answers every value, the context package's own key
// too, from the request's.
type detachedParent struct{ parent context.Context }

func (detachedParent) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detachedParent) Done() <-chan struct{}       { return nil }
func (detachedParent) Err() error                  { return nil }
func (d detachedParent) Value(k any) any           { return d.parent.Value(k) }

type detachedKey struct{}

// A shared bound over such a context, whose request has ended, has no
// cause while it runs and the timeout's once it ends, as do the contexts a
// journal derives from it; the caller's values are still there.
func TestSharedBoundCauseIgnoresADetachedParent(t *testing.T) {
	t.Parallel()
	req, cancel := context.WithCancelCause(context.WithValue(context.Background(), detachedKey{}, "v"))
	cancel(errors.New("the request ended"))
	var s sharedTimeouts
	b := s.bound(detachedParent{parent: req}, timeoutShareMin)
	derived, stop := context.WithCancelCause(b)
	defer stop(nil)
	require.NoError(t, context.Cause(b), "a live shared bound")
	require.NoError(t, context.Cause(derived), "a live context derived from a shared bound")
	require.Equal(t, "v", b.Value(detachedKey{}))
	select {
	case <-derived.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a context derived from a 100 ms shared bound did not end in 30 s")
	}
	require.ErrorIs(t, context.Cause(b), context.DeadlineExceeded)
	require.ErrorIs(t, context.Cause(derived), context.DeadlineExceeded)
	require.ErrorIs(t, derived.Err(), context.DeadlineExceeded)
}

// Calls racing for the shared bounds, across many epochs: each gets a
// deadline no later than the journal timeout after bound returned, and no
// earlier than 99 % of it after bound was called.
func TestSharedBoundsUnderContention(t *testing.T) {
	t.Parallel()
	const d = timeoutShareMin // a slack of 1 ms: many epochs
	var s sharedTimeouts
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 2000 {
				before := time.Now()
				b := s.bound(context.Background(), d)
				after := time.Now()
				dl, ok := b.Deadline()
				switch {
				case !ok:
					errs <- errors.New("a shared bound without a deadline")
					return
				case dl.After(after.Add(d)):
					errs <- errors.New("a shared bound past the journal timeout: " + dl.Sub(after).String())
					return
				case dl.Before(before.Add(d - d/timeoutShareDivisor)):
					errs <- errors.New("a shared bound cut more than 1 %: " + dl.Sub(before).String())
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}
