package sqljournal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemretry/idemretry/journal"
)

// Update implements [journal.Journal.Update]: it stores rec's State,
// Attempts and Status in the action's record if that record has rec.Key,
// and leaves the key, its form, the fingerprint and the creation time
// alone. Attempts never go down. Done is final: a record already done keeps its State and Status
// whatever rec says; the rule is part of the UPDATE statement, so a stale
// writer on another machine cannot undo a recorded outcome either. It
// returns once the change is committed. It fails, changing nothing, with an
// error wrapping [journal.ErrNotFound] when the action has no record or
// its record has another key (replaced, or forgotten and created again),
// [journal.ErrInvalidRecord] for progress values Reserve would
// refuse, and [journal.ErrClosed] after Close.
func (j *Journal) Update(ctx context.Context, rec journal.Record) error {
	if err := j.usable(ctx, "update"); err != nil {
		return err
	}
	id := j.storedID(rec.ActionID)
	if err := checkID(id); err != nil {
		return fmt.Errorf("sqljournal: update: %w", err)
	}
	if err := journal.CheckProgress(rec); err != nil {
		return fmt.Errorf("sqljournal: update %q: %w", id, err)
	}
	if !journal.ValidKey(rec.Key) { // Reserve stores no such key
		return fmt.Errorf("sqljournal: update %q: %w", id, journal.ErrNotFound)
	}
	n, err := bounded(ctx, func() (int64, error) {
		res, err := j.db.ExecContext(ctx, j.q.update, id, rec.Key, int16(rec.State), rec.Attempts, rec.Status)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	if err != nil {
		return dbError(ctx, fmt.Sprintf("update %q", id), err)
	}
	if n == 0 {
		return fmt.Errorf("sqljournal: update %q: %w", id, journal.ErrNotFound)
	}
	return nil
}

// Get implements [journal.Getter]: the action's record as committed, or
// false if there is none. actionID may be the id as given or, with
// [WithHashedIDs], the digest form. It fails with
// [ErrMalformedRecord] (a [journal.ErrCorruptRecord]) when the row holds a
// record that no Journal writes, and with [journal.ErrClosed] after Close.
func (j *Journal) Get(ctx context.Context, actionID string) (journal.Record, bool, error) {
	if err := j.usable(ctx, "get"); err != nil {
		return journal.Record{}, false, err
	}
	id := j.storedID(actionID)
	if checkID(id) != nil {
		return journal.Record{}, false, nil // Reserve refuses such an id, so it has no record
	}
	r, err := bounded(ctx, func() (journal.Record, error) { return scanRecord(j.db.QueryRowContext(ctx, j.q.get, id)) })
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return journal.Record{}, false, nil
	case err != nil:
		return journal.Record{}, false, dbError(ctx, fmt.Sprintf("get %q", id), err)
	}
	return r, true, nil
}

// Unfinished implements [journal.Journal.Unfinished]: the pending and
// unknown records of every process sharing the table, oldest first, ties in
// byte order of action id. With [WithHashedIDs] their ActionID is the
// stored digest form. A row among them, or one of a state no Journal
// writes (neither done nor unfinished), that holds a record no Journal
// writes is left out, and the others are listed all the same, with an
// error wrapping a [*journal.CorruptRecordsError] that names every such
// row (each reason an [ErrMalformedRecord]: repair the row, or Forget the
// action once reconciled). It fails with [journal.ErrClosed] after Close.
func (j *Journal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	if err := j.usable(ctx, "unfinished"); err != nil {
		return nil, err
	}
	// A statement abandoned at ctx's end goes on alone (see bounded): what
	// it finds is its own until it returns.
	type listing struct {
		recs []journal.Record
		bad  journal.CorruptRecordsError
	}
	l, err := bounded(ctx, func() (*listing, error) {
		rows, err := j.db.QueryContext(ctx, j.q.unfinished)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		l := &listing{}
		for rows.Next() {
			r, err := scanRecord(rows)
			var m *malformedRow
			if errors.As(err, &m) {
				l.bad.IDs, l.bad.Errs = append(l.bad.IDs, m.id), append(l.bad.Errs, err)
				continue // named by id: the others are still to be resumed
			}
			if err != nil {
				return nil, err
			}
			l.recs = append(l.recs, r)
		}
		return l, rows.Err()
	})
	switch {
	case err != nil:
		return nil, dbError(ctx, "unfinished", err)
	case len(l.bad.IDs) > 0:
		return l.recs, fmt.Errorf("sqljournal: unfinished: %w", &l.bad)
	}
	return l.recs, nil
}

// Forget implements [journal.Journal.Forget]: it deletes the action's
// record, committed on return, whatever its state. actionID may be the id
// as given or, with [WithHashedIDs], the digest form that
// [Journal.Unfinished] returns. A missing record is not an error. It fails
// with [journal.ErrClosed] after Close.
func (j *Journal) Forget(ctx context.Context, actionID string) error {
	if err := j.usable(ctx, "forget"); err != nil {
		return err
	}
	id := j.storedID(actionID)
	if checkID(id) != nil {
		return nil // Reserve refuses such an id, so it has no record
	}
	_, err := bounded(ctx, func() (sql.Result, error) { return j.db.ExecContext(ctx, j.q.forget, id) })
	if err != nil {
		return dbError(ctx, fmt.Sprintf("forget %q", id), err)
	}
	return nil
}

// Expire deletes the done records whose key was minted more than the key
// window plus the grace ago ([WithKeyWindow], [WithGrace]: 48 hours by
// default) and returns how many it deleted. Pending and unknown records are
// never deleted: their outcome may be unknown, and such an action must
// never get a new key. Call it on a schedule (hourly is plenty); concurrent
// calls from several machines are harmless. It fails with
// [journal.ErrClosed] after Close.
func (j *Journal) Expire(ctx context.Context) (int64, error) {
	if err := j.usable(ctx, "expire"); err != nil {
		return 0, err
	}
	cutoff := j.cfg.now().Add(-j.cfg.retention()).UnixMilli()
	n, err := bounded(ctx, func() (int64, error) {
		res, err := j.db.ExecContext(ctx, j.q.expire, cutoff)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	if err != nil {
		return 0, dbError(ctx, "expire", err)
	}
	return n, nil
}
