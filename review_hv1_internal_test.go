package idemretry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
