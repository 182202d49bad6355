package sqljournal_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/journaltest"
	"github.com/idemretry/idemretry/sqljournal"
)

// The project's shared conformance suite, as every Journal runs it.
func TestJournalTestSuite(t *testing.T) {
	db := testDB(t)
	journaltest.Run(t, func(t *testing.T) idemretry.Journal {
		j, _ := openJournal(t, db)
		return j
	})
}

func TestJournalTestSuiteHashed(t *testing.T) {
	db := testDB(t)
	journaltest.Run(t, func(t *testing.T) idemretry.Journal {
		j, _ := openJournal(t, db, sqljournal.WithHashedActionIDs())
		return j
	}, journaltest.ReportedIDs(func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}))
}
