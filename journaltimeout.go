package idemretry

// This file holds the journal timeout's shared bounds: one timer for the
// journal calls, made within a moment of each other, whose caller's context
// can neither be cancelled nor expire.

import (
	"context"
	"sync/atomic"
	"time"
)

// Shared bounds. A journal call whose caller's context has neither a Done
// channel nor a deadline (context.Background and the values over it, as an
// app's requests often carry) is bounded by the journal timeout alone. Such
// calls do not each get a context.WithTimeout (five allocations and a
// timer armed and stopped, twice per action): the calls that start within
// a timeoutShareDivisor-th of the timeout of one another share one timer's
// context, and each gets a context of one allocation that answers with
// that timer for Deadline, Done and Err, and with the caller's context for
// Value (but the context package's own key: see boundContext.Value). A call
// so bounded may be cut short by up to that slack (never later than the
// journal timeout).
const (
	// timeoutShareDivisor sets the slack as a share of the journal timeout:
	// 1/100, so that a call is given at least 99 % of it.
	timeoutShareDivisor = 100
	// timeoutShareMin is the shortest journal timeout that is shared; a
	// shorter one (tests use them) keeps a timer per call.
	timeoutShareMin = 100 * time.Millisecond
)

// sharedTimeouts hands out the shared bounds of one Transport's journal
// calls. Its zero value is ready; it is safe for concurrent use.
type sharedTimeouts struct {
	cur atomic.Pointer[timeoutEpoch]
}

// timeoutEpoch is one shared timer: ctx ends at its deadline, and calls
// that start before reuseUntil (on the monotonic clock) share it.
type timeoutEpoch struct {
	ctx        context.Context
	reuseUntil time.Time
	d          time.Duration
	// cancel is kept, not called: calls may still hold ctx until its
	// deadline, when its timer releases it.
	cancel context.CancelFunc
}

// shareable reports whether a journal timeout of d is shared.
func shareable(d time.Duration) bool { return d >= timeoutShareMin }

// bound returns ctx bounded by the journal timeout d, for a ctx with no
// Done channel and no deadline (the caller checks) and a shareable d: a
// context that ends at most d from now, and no earlier than d less
// d/timeoutShareDivisor.
func (s *sharedTimeouts) bound(ctx context.Context, d time.Duration) context.Context {
	now := time.Now()
	e := s.cur.Load()
	if e == nil || e.d != d || !now.Before(e.reuseUntil) {
		c, cancel := context.WithDeadline(context.Background(), now.Add(d))
		e = &timeoutEpoch{ctx: c, reuseUntil: now.Add(d / timeoutShareDivisor), d: d, cancel: cancel}
		// Two calls that find the epoch over at once both make one; the
		// last stored is shared, and the other serves its own call.
		s.cur.Store(e)
	}
	return &boundContext{Context: ctx, bound: e.ctx}
}

// boundContext is a caller's context (which can neither be cancelled nor
// expire) bounded by a shared timer: it ends when the timer's context does,
// and holds the caller's values.
type boundContext struct {
	context.Context // the caller's: Value (but the context package's key)
	bound           context.Context
}

func (c *boundContext) Deadline() (time.Time, bool) { return c.bound.Deadline() }
func (c *boundContext) Done() <-chan struct{}       { return c.bound.Done() }
func (c *boundContext) Err() error                  { return c.bound.Err() }

// Value answers first from the shared timer's context, which answers only
// the context package's own key (its cancelCtx, over context.Background):
// context.Cause, and the contexts a journal derives (linked to the timer
// as its children, with no goroutine), then find the timer and its cause,
// not a cancelled context that the caller's values may still lead to (a
// context of the app's own type that detaches a request's and passes all
// its values on). Every other key is the caller's.
func (c *boundContext) Value(key any) any {
	if v := c.bound.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
