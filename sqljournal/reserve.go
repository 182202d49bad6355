package sqljournal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// reserveTries bounds Reserve's loop. Each extra try needs another client
// to forget or finish the action between two of our statements, so a few
// are plenty.
const reserveTries = 8

// Reserve implements [journal.Journal.Reserve]. With [journal.ReuseAny]
// it inserts rec unless the action has a record; with
// [journal.ReusePending] it also replaces a done record. Either way the
// decision is one INSERT ... ON CONFLICT statement, so concurrent Reserves
// of an action, from any process, agree on one record. When the statement
// wrote nothing, a SELECT reads the record that won; if that record vanished
// or became done in between, Reserve tries again (up to a few times, then
// [ErrContended]). A created record is committed, so durable, on return.
//
// A record is created with the earlier of rec.CreatedAt and the database's
// clock as its creation time, and returned so. The machines of a fleet
// judge a key's window by its record's creation time: one whose clock ran
// ahead when it minted the key would otherwise make the key look younger to
// every other machine than it is, and have them send it after its window,
// when the server may have forgotten it and would perform the action again.
// A clock behind the database's makes the key look older, so refused
// sooner, never sent later.
//
// The returned record carries rec.ActionID as given, even when ids are
// hashed. Reserve fails with [journal.ErrInvalidRecord] for a record no
// Transport makes: one that [journal.CheckRecord] refuses (the id judged as
// stored), or whose id PostgreSQL text cannot hold (a NUL byte, invalid
// UTF-8); with [ErrMalformedRecord] (a [journal.ErrCorruptRecord]) when the
// action's row holds a record that no Journal writes, which it neither
// returns nor replaces; and with [journal.ErrClosed] after Close.
//
// Each try runs in a transaction begun at READ COMMITTED, whatever the
// database's or the role's default_transaction_isolation: at REPEATABLE READ
// or SERIALIZABLE, an INSERT ... ON CONFLICT that meets a row committed
// after its snapshot fails with a serialization error (SQLSTATE 40001)
// instead of yielding to it, and the SELECT that follows would not see the
// winner. At READ COMMITTED each statement sees every row committed before
// it started, which is what the decision needs; the insert and the read
// touch one row, so the stricter levels would add nothing.
func (j *Journal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if err := j.usable(ctx, "reserve"); err != nil {
		return journal.Record{}, false, err
	}
	if rec.ActionID == "" { // even hashed: its digest would pass
		return journal.Record{}, false, fmt.Errorf("sqljournal: reserve: %w: empty action id", journal.ErrInvalidRecord)
	}
	id := j.storedID(rec.ActionID)
	if err := checkID(id); err != nil {
		return journal.Record{}, false, fmt.Errorf("sqljournal: reserve: %w", err)
	}
	stored := rec
	stored.ActionID = id // a hashed id may be longer than the rule allows
	if err := journal.CheckRecord(stored); err != nil {
		return journal.Record{}, false, fmt.Errorf("sqljournal: reserve %q: %w", id, err)
	}
	insert := j.q.insertKeep
	if mode != journal.ReuseAny { // as Memory: any other mode reuses pending only
		insert = j.q.insertReplaceDone
	}
	type reserved struct {
		got     journal.Record
		created bool
	}
	r, err := bounded(ctx, func() (reserved, error) {
		for range reserveTries {
			got, created, retry, err := j.reserveOnce(ctx, insert, id, rec, mode)
			switch {
			case err != nil:
				return reserved{}, err
			case retry:
				continue
			case created:
				return reserved{got, true}, nil
			}
			got.ActionID = rec.ActionID
			return reserved{got, false}, nil
		}
		return reserved{}, ErrContended
	})
	if err != nil {
		return journal.Record{}, false, dbError(ctx, fmt.Sprintf("reserve %q", id), err)
	}
	return r.got, r.created, nil
}

// reserveOnce is one try of Reserve, in a READ COMMITTED transaction (see
// Reserve): the insert, committed when it wrote the record (created), else
// a read of the record that won. retry: that record vanished, or became
// done under a mode that may replace it, since the insert. A created record
// is returned as stored: its CreatedAt is the database's clock if that was
// earlier (see Reserve).
func (j *Journal) reserveOnce(ctx context.Context, insert, id string, rec journal.Record, mode journal.ReserveMode) (got journal.Record, created, retry bool, err error) {
	tx, err := j.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return journal.Record{}, false, false, err
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	var createdMs, clockUs int64
	at := time.Now()
	err = tx.QueryRowContext(ctx, insert, id, rec.Key, rec.Fingerprint[:], rec.CreatedAt.UnixMilli(),
		int16(rec.State), rec.Attempts, rec.Status, int16(rec.KeyForm)).Scan(&createdMs, &clockUs)
	if err == nil {
		j.clk.observe(clockUs, at)
		// Created only once committed: a failed Commit leaves the outcome
		// unknown to us, and Reserve's error keeps the caller from sending;
		// a later Reserve returns the record if it was committed.
		if err := tx.Commit(); err != nil {
			return journal.Record{}, false, false, err
		}
		if createdMs != rec.CreatedAt.UnixMilli() { // the database's clock was behind rec's
			rec.CreatedAt = time.UnixMilli(createdMs)
		}
		return rec, true, false, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return journal.Record{}, false, false, err
	}
	at = time.Now()
	got, err = scanRecord(withClock{tx.QueryRowContext(ctx, j.q.getClocked, id), &clockUs})
	if err == nil {
		j.clk.observe(clockUs, at)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return journal.Record{}, false, true, nil // forgotten since the insert: insert again
	case err != nil:
		return journal.Record{}, false, false, err
	case mode != journal.ReuseAny && got.State == journal.StateDone:
		return journal.Record{}, false, true, nil // finished since the insert: now it may be replaced
	}
	return got, false, false, nil
}

// withClock is a row of getClocked: a record's columns, then the
// database's clock, scanned into us.
type withClock struct {
	row *sql.Row
	us  *int64
}

func (w withClock) Scan(dest ...any) error { return w.row.Scan(append(dest, w.us)...) }
