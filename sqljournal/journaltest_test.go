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
	}, journaltest.Stall(stallTable(db, &tables)), journaltest.EarlierCreatedAt(time.Minute))
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
	}), journaltest.Stall(stallTable(db, &tables)), journaltest.EarlierCreatedAt(time.Minute))
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
