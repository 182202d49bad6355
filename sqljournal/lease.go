package sqljournal

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemretry/idemretry/journal"
)

var _ journal.Leaser = (*Journal)(nil)

// leaseTries bounds Lease's loop: each extra try needs the lease to change
// hands between two statements (see queries.lease).
const leaseTries = 8

// Lease implements [journal.Leaser.Lease]: it takes or renews holder's
// lease on the action in the action's row (lease_holder, lease_until),
// until ttl after the database's now(), in one UPDATE that succeeds only
// when the lease is free, holder's own or ended by the database's clock.
// Machines whose clocks disagree therefore agree on who holds it. When
// another holder's lease has not ended, it returns held false and when that
// lease ends, as the database's time left added to the caller's clock when
// the answer came; when held, until is ttl from the call's start on the
// caller's clock, no later than the database's end of the lease.
//
// actionID may be the id as given or, with [WithHashedIDs], the digest
// form that [Journal.Unfinished] returns. It fails with an error wrapping
// [journal.ErrNotFound] when the action has no record,
// [journal.ErrInvalidRecord] for an id Reserve refuses, a holder that
// journal.ValidKey refuses or a ttl under a millisecond,
// [journal.ErrUnavailable] when the database does not answer (see
// [Journal]), and [journal.ErrClosed] after Close.
func (j *Journal) Lease(ctx context.Context, actionID, holder string, ttl time.Duration) (held bool, until time.Time, err error) {
	if err := j.usable(ctx, "lease"); err != nil {
		return false, time.Time{}, err
	}
	if actionID == "" { // even hashed: its digest would pass
		return false, time.Time{}, fmt.Errorf("sqljournal: lease: %w: empty action id", journal.ErrInvalidRecord)
	}
	id := j.storedID(actionID)
	if err := checkLease(id, holder); err != nil {
		return false, time.Time{}, fmt.Errorf("sqljournal: lease: %w", err)
	}
	if ttl < time.Millisecond {
		return false, time.Time{}, fmt.Errorf("sqljournal: lease %q: %w: ttl %v, want at least 1ms", id, journal.ErrInvalidRecord, ttl)
	}
	type outcome struct {
		held bool
		left time.Duration
	}
	start := time.Now()
	o, err := bounded(ctx, func() (outcome, error) {
		for range leaseTries {
			var (
				took, found bool
				other       sql.NullString
				leftMs      int64
			)
			if err := j.db.QueryRowContext(ctx, j.q.lease, id, holder, ttl.Milliseconds()).Scan(&took, &found, &other, &leftMs); err != nil {
				return outcome{}, err
			}
			switch {
			case took:
				return outcome{held: true}, nil
			case !found:
				return outcome{}, journal.ErrNotFound
			case other.Valid && other.String != holder && leftMs > 0:
				return outcome{left: time.Duration(leftMs) * time.Millisecond}, nil
			}
			// Refused, yet free in the statement's snapshot: a concurrent
			// caller took it since. Ask again.
		}
		return outcome{}, ErrContended
	})
	switch {
	case err == journal.ErrNotFound:
		return false, time.Time{}, fmt.Errorf("sqljournal: lease %q: %w", id, journal.ErrNotFound)
	case err != nil:
		return false, time.Time{}, dbError(ctx, fmt.Sprintf("lease %q", id), err)
	case o.held:
		return true, start.Add(ttl.Truncate(time.Millisecond)), nil
	}
	return false, time.Now().Add(o.left), nil
}

// Release implements [journal.Leaser.Release]: it clears holder's lease on
// the action, if holder has it, committed on return. It fails with
// [journal.ErrInvalidRecord] for an id Reserve refuses or a holder that
// journal.ValidKey refuses, [journal.ErrUnavailable] when the database
// does not answer, and [journal.ErrClosed] after Close.
func (j *Journal) Release(ctx context.Context, actionID, holder string) error {
	if err := j.usable(ctx, "release"); err != nil {
		return err
	}
	if actionID == "" {
		return fmt.Errorf("sqljournal: release: %w: empty action id", journal.ErrInvalidRecord)
	}
	id := j.storedID(actionID)
	if err := checkLease(id, holder); err != nil {
		return fmt.Errorf("sqljournal: release: %w", err)
	}
	_, err := bounded(ctx, func() (sql.Result, error) { return j.db.ExecContext(ctx, j.q.release, id, holder) })
	if err != nil {
		return dbError(ctx, fmt.Sprintf("release %q", id), err)
	}
	return nil
}

// checkLease refuses an id the table cannot hold and a holder that
// journal.ValidKey refuses.
func checkLease(id, holder string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !journal.ValidKey(holder) {
		return fmt.Errorf("%w: lease holder of %d bytes: want 1-%d visible ASCII characters", journal.ErrInvalidRecord, len(holder), journal.MaxKeyLength)
	}
	return nil
}
