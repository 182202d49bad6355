// Package backoffs holds the backoffs the simulations compare with
// idemretry.FullJitter, the Transport's default: equal jitter, decorrelated
// jitter and plain exponential backoff, as the AWS Architecture Blog's
// "Exponential Backoff And Jitter" defines them. They live here, next to the
// simulations that use them, because a Transport has no reason to wait any
// other way than with full jitter.
//
// Attempt numbering is idemretry's: the first call to NextBackOff after
// creation or Reset returns the wait before the first retry, and for it
// n = 0, so its ceiling is Base. None of these backoffs ever returns
// backoff.Stop.
package backoffs

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
)

// Top is a Random that always draws the top of the range, so a jittered
// backoff shows its ceiling (less one nanosecond).
var Top idemretry.Random = top{}

type top struct{}

func (top) Int64N(n int64) int64 { return n - 1 }

// EqualJitter keeps half of the exponential ceiling and jitters the other
// half: the wait before retry n is v/2 + U[0, v/2) with v = min(Cap, Base*2^n).
// Not safe for concurrent use.
type EqualJitter struct {
	Base, Cap time.Duration
	Rand      idemretry.Random // nil: math/rand/v2's package functions
	n         int
}

// NewEqualJitter returns an equal-jitter backoff with the given base and cap.
func NewEqualJitter(base, cap time.Duration, r idemretry.Random) *EqualJitter {
	return &EqualJitter{Base: base, Cap: cap, Rand: r}
}

// NextBackOff returns the wait before the next retry.
func (b *EqualJitter) NextBackOff() time.Duration {
	half := ceiling(b.Base, b.Cap, b.n) / 2
	b.n++
	return half + draw(b.Rand, half)
}

// Reset starts the sequence again from n = 0.
func (b *EqualJitter) Reset() { b.n = 0 }

// DecorrelatedJitter grows each wait from the previous one rather than from
// the attempt number: sleep = min(Cap, U[Base, 3*previous)), starting from
// previous = Base. Not safe for concurrent use.
type DecorrelatedJitter struct {
	Base, Cap time.Duration
	Rand      idemretry.Random // nil: math/rand/v2's package functions
	prev      time.Duration
}

// NewDecorrelatedJitter returns a decorrelated-jitter backoff.
func NewDecorrelatedJitter(base, cap time.Duration, r idemretry.Random) *DecorrelatedJitter {
	return &DecorrelatedJitter{Base: base, Cap: cap, Rand: r}
}

// NextBackOff returns the wait before the next retry.
func (b *DecorrelatedJitter) NextBackOff() time.Duration {
	prev := max(b.prev, b.Base)
	hi := prev * 3
	if hi < prev { // overflow
		hi = b.Cap
	}
	b.prev = min(b.Cap, b.Base+draw(b.Rand, hi-b.Base))
	return b.prev
}

// Reset starts the sequence again from Base.
func (b *DecorrelatedJitter) Reset() { b.prev = 0 }

// Exponential is plain exponential backoff without jitter, min(Cap, Base*2^n).
// It is here for comparison: clients that fail together retry together.
type Exponential struct {
	Base, Cap time.Duration
	n         int
}

// NewExponential returns an un-jittered exponential backoff.
func NewExponential(base, cap time.Duration) *Exponential {
	return &Exponential{Base: base, Cap: cap}
}

// NextBackOff returns the wait before the next retry.
func (b *Exponential) NextBackOff() time.Duration {
	b.n++
	return ceiling(b.Base, b.Cap, b.n-1)
}

// Reset starts the sequence again from n = 0.
func (b *Exponential) Reset() { b.n = 0 }

// ceiling returns min(limit, base*2^n) without overflowing: base*2^n exceeds
// limit exactly when base exceeds limit/2^n rounded down.
func ceiling(base, limit time.Duration, n int) time.Duration {
	switch {
	case base <= 0:
		return 0
	case base > limit>>n:
		return limit
	}
	return base << n
}

// draw returns a duration in [0, span), or 0 without drawing when span is
// not positive (as idemretry.FullJitter does, so a seeded run draws the
// same numbers).
func draw(r idemretry.Random, span time.Duration) time.Duration {
	switch {
	case span <= 0:
		return 0
	case r == nil:
		return time.Duration(rand.Int64N(int64(span)))
	}
	return time.Duration(r.Int64N(int64(span)))
}

// Compile-time checks that every backoff here is a backoff.BackOff.
var (
	_ backoff.BackOff = (*EqualJitter)(nil)
	_ backoff.BackOff = (*DecorrelatedJitter)(nil)
	_ backoff.BackOff = (*Exponential)(nil)
)
