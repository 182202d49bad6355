package filejournal_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal/journaltest"
)

func TestJournalConformanceFile(t *testing.T) {
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, err := filejournal.Open(t.TempDir())
		require.NoError(t, err)
		return j
	})
}

func TestJournalConformanceFileHashed(t *testing.T) {
	t.Parallel()
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, err := filejournal.Open(t.TempDir(), filejournal.WithHashedIDs())
		require.NoError(t, err)
		return j
	}, journaltest.ReportedIDs(func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}))
}
