package idemretry

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Default backoff settings: waits of at most 0.5, 1, 2, 4 and 8 seconds,
// 15.5 seconds in the worst case.
const (
	// DefaultBaseDelay is the ceiling of the first retry's wait.
	DefaultBaseDelay = 500 * time.Millisecond
	// DefaultMaxDelay caps every wait the backoff itself draws.
	DefaultMaxDelay = 8 * time.Second
	// DefaultMaxRetries is how many retries follow the first attempt
	// (DefaultMaxRetries+1 attempts in all).
	DefaultMaxRetries = 5
)

// Random is the source a jittered backoff draws from. A *math/rand/v2.Rand
// satisfies it; pass one built from a fixed seed to reproduce a run. A nil
// Random means the math/rand/v2 package functions, which are safe for
// concurrent use; a *rand.Rand is not, so do not share one between backoffs
// that run concurrently.
type Random interface {
	// Int64N returns a value in [0, n) for n > 0.
	Int64N(n int64) int64
}

// FullJitter is exponential backoff with full jitter: the wait before retry
// n is drawn uniformly from [0, min(Cap, Base*2^n)). It spreads retries evenly
// over the whole window and, in the AWS study, costs the server the least work.
// It is the Transport's default. A FullJitter is not safe for concurrent use;
// the Transport makes one per action.
//
// Attempt numbering, shared by every backoff in this file: the first call to
// NextBackOff after creation or Reset returns the wait before the first retry,
// and for it n = 0, so its ceiling is Base. The ceiling of the wait before
// retry k (k = 1, 2, ...) is min(Cap, Base*2^(k-1)). The AWS Architecture
// Blog's simulator numbers the first retry n = 1; pass twice its base to get
// its ceilings. None of these backoffs ever returns backoff.Stop: how many
// retries are made is the Transport's decision (see WithMaxRetries). Wrap one
// in backoff.WithMaxRetries to use it elsewhere.
type FullJitter struct {
	Base, Cap time.Duration
	Rand      Random // nil: math/rand/v2's package functions
	n         int
}

// NewFullJitter returns a full-jitter backoff with the given base and cap.
func NewFullJitter(base, cap time.Duration, r Random) *FullJitter {
	return &FullJitter{Base: base, Cap: cap, Rand: r}
}

// NextBackOff returns the wait before the next retry.
func (b *FullJitter) NextBackOff() time.Duration {
	v := ceiling(b.Base, b.Cap, b.n)
	b.n++
	return uniform(b.Rand, 0, v)
}

// Reset starts the sequence again from n = 0.
func (b *FullJitter) Reset() { b.n = 0 }

// EqualJitter keeps half of the exponential ceiling and jitters the other
// half: the wait before retry n is v/2 + U[0, v/2) with v = min(Cap, Base*2^n).
// Not safe for concurrent use.
type EqualJitter struct {
	Base, Cap time.Duration
	Rand      Random
	n         int
}

// NewEqualJitter returns an equal-jitter backoff with the given base and cap.
func NewEqualJitter(base, cap time.Duration, r Random) *EqualJitter {
	return &EqualJitter{Base: base, Cap: cap, Rand: r}
}

// NextBackOff returns the wait before the next retry.
func (b *EqualJitter) NextBackOff() time.Duration {
	v := ceiling(b.Base, b.Cap, b.n)
	b.n++
	return v/2 + uniform(b.Rand, 0, v/2)
}

// Reset starts the sequence again from n = 0.
func (b *EqualJitter) Reset() { b.n = 0 }

// DecorrelatedJitter grows each wait from the previous one rather than from
// the attempt number: sleep = min(Cap, U[Base, 3*previous)), starting from
// previous = Base. Not safe for concurrent use.
type DecorrelatedJitter struct {
	Base, Cap time.Duration
	Rand      Random
	prev      time.Duration
}

// NewDecorrelatedJitter returns a decorrelated-jitter backoff.
func NewDecorrelatedJitter(base, cap time.Duration, r Random) *DecorrelatedJitter {
	return &DecorrelatedJitter{Base: base, Cap: cap, Rand: r}
}

// NextBackOff returns the wait before the next retry.
func (b *DecorrelatedJitter) NextBackOff() time.Duration {
	prev := b.prev
	if prev < b.Base {
		prev = b.Base
	}
	hi := prev * 3
	if hi < prev { // overflow
		hi = b.Cap
	}
	d := uniform(b.Rand, b.Base, hi)
	if d > b.Cap {
		d = b.Cap
	}
	b.prev = d
	return d
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
	v := ceiling(b.Base, b.Cap, b.n)
	b.n++
	return v
}

// Reset starts the sequence again from n = 0.
func (b *Exponential) Reset() { b.n = 0 }

// ceiling returns min(limit, base*2^n) without overflowing.
func ceiling(base, limit time.Duration, n int) time.Duration {
	if base <= 0 {
		return 0
	}
	if limit < base {
		return limit
	}
	v := base
	for i := 0; i < n; i++ {
		if v >= limit/2 {
			return limit
		}
		v *= 2
	}
	return v
}

// uniform returns a duration in [lo, hi), or lo when the range is empty.
func uniform(r Random, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	span := int64(hi - lo)
	if r == nil {
		return lo + time.Duration(rand.Int64N(span))
	}
	return lo + time.Duration(r.Int64N(span))
}

// Compile-time checks that every backoff here is a backoff.BackOff.
var (
	_ backoff.BackOff = (*FullJitter)(nil)
	_ backoff.BackOff = (*EqualJitter)(nil)
	_ backoff.BackOff = (*DecorrelatedJitter)(nil)
	_ backoff.BackOff = (*Exponential)(nil)
)
