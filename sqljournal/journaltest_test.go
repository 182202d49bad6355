package sqljournal_test

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry/journal/journaltest"
	"github.com/idemretry/idemretry/sqljournal"
)

// The project's shared conformance suite, as every Journal runs it, with a
// stalled database for BoundedByContext: another session holds an ACCESS
// EXCLUSIVE lock on the journal's table, so every statement on it waits.
func TestJournalTestSuite(t *testing.T) {
	db := testDB(t)
	var tables sync.Map // *sqljournal.Journal -> its table
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, table := openJournal(t, db)
		tables.Store(j, table)
		return j
	}, journaltest.Stall(stallTable(db, &tables)), journaltest.EarlierCreatedAt(time.Minute),
		journaltest.Corrupt(updateRow(db, &tables, false)))
}

func TestJournalTestSuiteHashed(t *testing.T) {
	db := testDB(t)
	var tables sync.Map
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, table := openJournal(t, db, sqljournal.WithHashedActionIDs())
		tables.Store(j, table)
		return j
	}, journaltest.ReportedIDs(func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}), journaltest.Stall(stallTable(db, &tables)), journaltest.EarlierCreatedAt(time.Minute),
		journaltest.Corrupt(updateRow(db, &tables, true)))
}

// updateRow returns a Corrupt for journaltest: an UPDATE of the row of
// rec.ActionID (its digest, if hashed) that sets every column to rec's
// values, as someone else's statement on the table would. A value the
// columns cannot hold (attempts or status past an integer's range) skips
// the case.
func updateRow(db *sql.DB, tables *sync.Map, hashed bool) func(t *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error) {
	return func(t *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error) {
		t.Helper()
		table, ok := tables.Load(j)
		if !ok {
			t.Fatalf("corrupt: unknown journal %p", j)
		}
		if int64(rec.Attempts) != int64(int32(rec.Attempts)) || int64(rec.Status) != int64(int32(rec.Status)) ||
			int64(rec.State) != int64(int16(rec.State)) {
			t.Skipf("the table's integer columns cannot hold %+v", rec)
		}
		id := rec.ActionID
		if hashed {
			id = journal.Digest(id)
		}
		res, err := db.Exec(`UPDATE "`+table.(string)+`" SET key = $2, fingerprint = $3, created_at = $4, state = $5, attempts = $6, status = $7
			WHERE action_id = $1`, id, rec.Key, rec.Fingerprint[:], rec.CreatedAt.UnixMilli(), int16(rec.State), rec.Attempts, rec.Status)
		if err != nil {
			t.Fatalf("corrupt: %v", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("corrupt: %d rows updated", n)
		}
		return j, nil
	}
}

// stallTable returns a stall for journaltest: a transaction of its own that
// locks the journal's table in ACCESS EXCLUSIVE mode (which every read and
// write waits for) until release rolls it back.
func stallTable(db *sql.DB, tables *sync.Map) func(t *testing.T, j journal.Journal) func() {
	return func(t *testing.T, j journal.Journal) func() {
		t.Helper()
		table, ok := tables.Load(j)
		if !ok {
			t.Fatalf("stall: unknown journal %p", j)
		}
		tx, err := holdLock(db, lockTable(table.(string)))
		if err != nil {
			t.Fatalf("stall: %v", err)
		}
		return func() {
			if err := tx.Rollback(); err != nil {
				t.Errorf("release stall: %v", err)
			}
		}
	}
}
