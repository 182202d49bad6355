package journal

import (
	"math"
	"time"
)

// Defaults that the Transport and the journals of this module share. Each
// is defined here, once; the other packages refer to these.
const (
	// DefaultKeyWindow is how long a server keeps an Idempotency-Key:
	// Stripe prunes keys once they are at least 24 hours old. It is the
	// Transport's key window unless idemretry.WithKeyWindow sets another,
	// and the window a journal keeps done records for unless told otherwise
	// (WithKeyWindow, filejournal.WithKeyWindow, sqljournal.WithKeyWindow).
	DefaultKeyWindow = 24 * time.Hour
	// DefaultGrace is how long a done record is kept beyond the key window
	// (WithGrace, filejournal.WithGrace, sqljournal.WithGrace), so that a
	// clock that drifted or a server that keeps keys a little longer cannot
	// make a journal forget a key the server still holds. It is also how
	// far ahead of the clock the file journal's persisted clock mark is
	// believed, by the journal and by the Transport.
	DefaultGrace = 24 * time.Hour
	// DefaultRetention is how long a journal keeps a done record unless
	// told otherwise: DefaultKeyWindow plus DefaultGrace, so that a repeat
	// within the window always finds its key.
	DefaultRetention = DefaultKeyWindow + DefaultGrace
)

// A MemoryOption configures a Memory journal (NewMemory). A nil
// MemoryOption is skipped.
type MemoryOption func(*Memory)

// WithKeyWindow tells the journal the key window of the Transport that uses
// it (default DefaultKeyWindow): a done record is kept for the window plus
// the grace (WithGrace) after it was reserved. Give it the value given to
// idemretry.WithKeyWindow, or more. A window of zero or less keeps the
// default (NewMemory returns no error).
func WithKeyWindow(window time.Duration) MemoryOption {
	return func(j *Memory) {
		if window > 0 {
			j.keyWindow = window
		}
	}
}

// WithGrace sets how long a done record is kept beyond the key window
// (default DefaultGrace). A negative grace keeps the default (NewMemory
// returns no error).
func WithGrace(grace time.Duration) MemoryOption {
	return func(j *Memory) {
		if grace >= 0 {
			j.grace = grace
		}
	}
}

// WithClock replaces time.Now, for tests and simulations (default
// time.Now). A nil now keeps the default.
func WithClock(now func() time.Time) MemoryOption {
	return func(j *Memory) {
		if now != nil {
			j.now = now
		}
	}
}

// MemoryRetention sets how long a done record is kept to d: the same as
// WithKeyWindow(d) with WithGrace(0). A d of zero or less keeps the
// default.
//
// Deprecated: use WithKeyWindow and WithGrace.
func MemoryRetention(d time.Duration) MemoryOption {
	return func(j *Memory) {
		if d > 0 {
			j.keyWindow, j.grace = d, 0
		}
	}
}

// MemoryClock replaces time.Now, for tests and simulations.
//
// Deprecated: use WithClock.
func MemoryClock(now func() time.Time) MemoryOption { return WithClock(now) }

// retention is window plus grace, or the longest duration if that
// overflows: records kept "forever".
func retention(window, grace time.Duration) time.Duration {
	if grace > math.MaxInt64-window {
		return math.MaxInt64
	}
	return window + grace
}
