package filejournal

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Model of a platform whose renames may not be durable (no directory sync,
// where datasync.Dir does nothing: see dirsync.go; before
// MOVEFILE_WRITE_THROUGH, Windows). After a compaction, acknowledged
// Reserves are appended to the new file. A power loss that does not keep
// the rename leaves the old journal under
// "journal" and the new file, holding those acknowledged records, under
// "journal.tmp". Open must adopt journal.tmp, whose base sequence is past
// journal's last one, not delete it (see the package doc, "journal.tmp at
// recovery"). (Found in review: the record was lost.)
func TestLostCompactionRenameKeepsAppends(t *testing.T) {
	dir := t.TempDir()
	s, compact := openKeepingOldJournal(t, dir)
	reserve(t, s, entry("before"))
	oldJournal := compact()
	acked := reserve(t, s, entry("after-compaction")) // durable per the contract
	require.NoError(t, s.Close())
	newJournal, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	require.NotNil(t, oldJournal)

	// Image without the durable rename: old name kept, new file under tmp.
	img := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(img, journalName), oldJournal, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(img, tmpName), newJournal, 0o600))
	requireRecovered(t, img, acked.ActionID)
}

// Same model, for the journal's creation: Open creates it as journal.tmp
// and renames it. If that rename is not durable but later appends (through
// the same handle) are, the disk holds only journal.tmp: a snapshot
// followed by batch frames. It is a complete snapshot even though it does
// not end with the end record, and Open must adopt it. (Found in review:
// Open deleted it and started an empty journal.)
func TestLostCreationRenameKeepsRecords(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	acked := reserve(t, s, entry("first-payment"))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)

	img := t.TempDir() // the rename was lost: only the old name exists
	require.NoError(t, os.WriteFile(filepath.Join(img, tmpName), data, 0o600))
	requireRecovered(t, img, acked.ActionID)
}

// requireRecovered opens the disk image img and requires it to hold the
// acknowledged record id.
func requireRecovered(t *testing.T, img, id string) {
	t.Helper()
	s, rep := mustOpen(t, img, testOpts())
	defer s.Close()
	_, found, _ := s.get(id)
	require.True(t, found, "acknowledged record lost; report %+v", rep)
}

// Open creates missing directories, syncing the parent of each: a nested,
// not yet existing journal directory works and keeps its records.
func TestOpenCreatesNestedDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "journal")
	s, _ := mustOpen(t, dir, testOpts())
	e := reserve(t, s, entry("pay:1"))
	require.NoError(t, s.Close())
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.True(t, fi.IsDir())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	_, found, _ := s.get(e.ActionID)
	require.True(t, found)
}

// openKeepingOldJournal opens a journal in dir, and returns it with compact,
// which compacts it and returns what the file "journal" held when the
// compaction's journal.tmp was synced: what a crash losing the rename that
// followed leaves under that name.
func openKeepingOldJournal(t *testing.T, dir string) (*Journal, func() []byte) {
	t.Helper()
	var old []byte
	armed := false
	o := testOpts()
	o.hooks = &hooks{failpoint: func(fp string) {
		if armed && fp == fpTmpSynced {
			b, err := os.ReadFile(filepath.Join(dir, journalName))
			if err == nil {
				old = b
			}
		}
	}}
	s, _ := mustOpen(t, dir, o)
	return s, func() []byte {
		t.Helper()
		armed = true
		require.NoError(t, s.Compact(context.Background()))
		require.NotNil(t, old)
		return old
	}
}
