package idemretry

// This file holds the arithmetic of the limits a caller gives (sizes,
// durations, deadlines): every sum of one saturates instead of wrapping
// around, so that math.MaxInt64, the usual way to say "no limit", means no
// limit. Each option's value is only checked for its sign (options.go);
// whatever passes is summed here.

import (
	"math"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// addSat returns a+b, or the nearest of math.MaxInt64 and math.MinInt64
// when the sum does not fit.
func addSat[N ~int64](a, b N) N {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// addDuration returns a+b, saturated.
func addDuration(a, b time.Duration) time.Duration { return addSat(a, b) }

// addSize returns a+b, saturated: addSize(limit, 1) is how much to read to
// tell a body of limit bytes from a longer one.
func addSize(a, b int64) int64 { return addSat(a, b) }

// untilPlus returns time.Until(t)+d, saturated: a deadline ~292 years
// ahead (context.WithTimeout(ctx, math.MaxInt64)) is as far as a
// Duration goes, not one already past.
func untilPlus(t time.Time, d time.Duration) time.Duration {
	return addDuration(time.Until(t), d)
}

// sincePlus returns now.Sub(t)+d, saturated: how old something made at t
// will be after a wait of d.
func sincePlus(now, t time.Time, d time.Duration) time.Duration {
	return addDuration(now.Sub(t), d)
}

// addCount returns a+b for attempt counts, neither negative, saturated at
// journal.MaxAttempts, the bound every journal holds: a record at that
// bound (2^31-1) must take its outcome on a 32-bit int too, where a+b
// would wrap around.
func addCount(a, b int) int {
	if a > journal.MaxAttempts-b {
		return journal.MaxAttempts
	}
	return a + b
}
