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
// Attempt numbering: the first call to NextBackOff after creation or Reset
// returns the wait before the first retry, and for it n = 0, so its ceiling
// is Base. The ceiling of the wait before retry k (k = 1, 2, ...) is
// min(Cap, Base*2^(k-1)). The AWS Architecture Blog's simulator numbers the
// first retry n = 1; pass twice its base to get its ceilings. FullJitter
// never returns backoff.Stop: how many retries are made is the Transport's
// decision (see WithMaxRetries). Wrap it in backoff.WithMaxRetries to use it
// elsewhere. The blog's other backoffs (equal and decorrelated jitter, plain
// exponential), which the simulations in examples/ compare with it, live
// there, in examples/internal/backoffs.
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

// FullJitter is a backoff.BackOff.
var _ backoff.BackOff = (*FullJitter)(nil)
