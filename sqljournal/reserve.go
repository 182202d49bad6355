package sqljournal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemretry/idemretry"
)

// reserveTries bounds Reserve's loop. Each extra try needs another client
// to forget or finish the action between two of our statements, so a few
// are plenty.
const reserveTries = 8

// Reserve implements [idemretry.Journal.Reserve]. With [idemretry.ReuseAny]
// it inserts rec unless the action has a record; with
// [idemretry.ReusePending] it also replaces a done record. Either way the
// decision is one INSERT ... ON CONFLICT statement, so concurrent Reserves
// of an action, from any process, agree on one record. When the statement
// wrote nothing, a SELECT reads the record that won; if that record vanished
// or became done in between, Reserve tries again (up to a few times, then
// [ErrContended]). A created record is committed, so durable, on return.
//
// The returned record carries rec.ActionID as given, even when ids are
// hashed. Reserve fails with [idemretry.ErrJournalInvalidRecord] for a
// record no Transport makes (an empty id, or one the table cannot hold; a
// key that is not 1 to 255 visible ASCII characters; a state other than
// the three, negative Attempts or Status), and with
// [idemretry.ErrJournalClosed] after Close.
func (j *Journal) Reserve(ctx context.Context, rec idemretry.Record, mode idemretry.ReserveMode) (idemretry.Record, bool, error) {
	if err := j.usable(ctx, "reserve"); err != nil {
		return idemretry.Record{}, false, err
	}
	if rec.ActionID == "" {
		return idemretry.Record{}, false, fmt.Errorf("sqljournal: reserve: %w: empty action id", idemretry.ErrJournalInvalidRecord)
	}
	id := j.storedID(rec.ActionID)
	if err := checkID(id); err != nil {
		return idemretry.Record{}, false, fmt.Errorf("sqljournal: reserve: %w", err)
	}
	if err := checkRecord(rec); err != nil {
		return idemretry.Record{}, false, fmt.Errorf("sqljournal: reserve %q: %w", id, err)
	}
	insert := j.q.insertKeep
	if mode != idemretry.ReuseAny { // as MemoryJournal: any other mode reuses pending only
		insert = j.q.insertReplaceDone
	}
	for range reserveTries {
		var one int
		err := j.db.QueryRowContext(ctx, insert, id, rec.Key, rec.Fingerprint[:], rec.CreatedAt.UnixMilli(),
			int16(rec.State), rec.Attempts, rec.Status).Scan(&one)
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return idemretry.Record{}, false, fmt.Errorf("sqljournal: reserve %q: %w", id, err)
		}
		got, err := scanRecord(j.db.QueryRowContext(ctx, j.q.get, id))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			continue // forgotten since the insert: insert again
		case err != nil:
			return idemretry.Record{}, false, fmt.Errorf("sqljournal: reserve %q: %w", id, err)
		case mode != idemretry.ReuseAny && got.State == idemretry.StateDone:
			continue // finished since the insert: now it may be replaced
		}
		got.ActionID = rec.ActionID
		return got, false, nil
	}
	return idemretry.Record{}, false, fmt.Errorf("sqljournal: reserve %q: %w", id, ErrContended)
}
