package journal

import (
	"context"
	"time"
)

// A Syncer is a Journal that can make the updates it has accepted durable on
// demand (Update may be lazy). The Transport calls Sync after recording the
// outcome of an action named by its request's fingerprint: lost, a
// deliberate repeat after a crash would reuse the old key and be answered
// with the old payment's replay. Sync must return by the context's deadline.
type Syncer interface {
	Sync(ctx context.Context) error
}

// A Timekeeper is a Journal that keeps a time that never goes backwards: the
// latest clock reading it has seen, persisted. The Transport judges key
// windows by it when the clock is behind it (set back) by no more than the
// grace it was given, so that a clock set back cannot make a key look
// younger than it is. Now must be cheap and safe for concurrent use.
type Timekeeper interface {
	Now() time.Time
}
