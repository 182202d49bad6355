package sqljournal

import (
	"context"
	"fmt"
	"time"
)

// driverGrace is how long a call waits, once its context has ended, for
// the driver to report the statement's end itself (pgx does at once).
const driverGrace = 50 * time.Millisecond

// bounded runs f, whose statements use ctx, and returns its results, or
// ctx's error once ctx has ended (and driverGrace has passed) while f still
// runs. Drivers do not all end a statement when its context does: pgx
// closes the connection at once, but a driver that only asks the server to
// cancel waits for an answer, which a paused or partitioned server never
// sends. Such a statement then goes on in its goroutine, holding its
// connection, until the server answers or the connection breaks; its
// outcome is dropped (as with any lost answer, it may still commit: see
// Journal). The caller is not held.
func bounded[T any](ctx context.Context, f func() (T, error)) (T, error) {
	if ctx.Done() == nil { // never ends: nothing to bound
		return f()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
	}
	t := time.NewTimer(driverGrace)
	defer t.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
		var zero T
		return zero, fmt.Errorf("no answer from the database: %w", ctx.Err())
	}
}
