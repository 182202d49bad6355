package filejournal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// asideFiles returns the names and sizes of the torn and corrupt copies,
// and of any other file but the journal's own, in dir.
func asideFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]int64{}
	for _, e := range ents {
		switch e.Name() {
		case journalName, lockName, secretName, "filler":
			continue
		}
		fi, err := e.Info()
		require.NoError(t, err)
		out[e.Name()] = fi.Size()
	}
	return out
}

// tornJournal returns a journal file of five records with a torn tail.
func tornJournal(t *testing.T) ([]byte, []journal.Record) {
	data, es := buildJournal(t, 5)
	return append(data, []byte(strings.Repeat("torn tail ", 30))...), es
}

// Issue 7, item 15, on a real full file system: opening a journal with a
// torn tail while the disk is full succeeds (the tail holds no acknowledged
// record, and is cut all the same), says why no copy was kept, leaves no
// empty or partial copy behind, and never prunes a real copy in favour of
// one; once there is room again, copies are made and pruned as before.
func TestTornTailOnFullDisk(t *testing.T) {
	mnt := smallFS(t)
	dir := filepath.Join(mnt, "j")
	require.NoError(t, os.Mkdir(dir, 0o700))
	real := []string{tornPrefix + "20200101T000000.000000001", tornPrefix + "20200101T000000.000000002", tornPrefix + "20200101T000000.000000003"}
	for _, n := range real {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("a real torn tail"), 0o600))
	}
	data, es := tornJournal(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), data, 0o600))
	fill(t, dir)

	for range 3 { // an app retrying its start, a torn tail each time
		s, rep, err := openWith(dir, testOpts())
		require.NoError(t, err, "open on a full disk with a torn tail")
		assert.True(t, rep.TornTail)
		assert.Empty(t, rep.TornCopy)
		assert.ErrorIs(t, rep.TornCopyErr, syscall.ENOSPC)
		for _, e := range es {
			got, ok, _ := s.get(e.ActionID)
			require.True(t, ok)
			assert.Equal(t, e.Key, got.Key)
		}
		require.NoError(t, s.Close())
		files := asideFiles(t, dir)
		assert.Len(t, files, len(real), "copies: %v", files)
		for _, n := range real {
			assert.Equal(t, int64(len("a real torn tail")), files[n], "%s pruned or emptied", n)
		}
		cur, err := os.ReadFile(filepath.Join(dir, journalName))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), append(cur, "torn again"...), 0o600))
	}

	require.NoError(t, os.Remove(filepath.Join(dir, "filler")))
	s, rep, err := openWith(dir, testOpts())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NotEmpty(t, rep.TornCopy)
	files := asideFiles(t, dir)
	assert.Len(t, files, 3)
	assert.Equal(t, int64(len("torn again")), files[filepath.Base(rep.TornCopy)])
	assert.NotContains(t, files, real[0], "the oldest copy is the one pruned")
}

// The same through the file seam, on any system: a copy whose write fails
// leaves nothing behind.
func TestTornCopyWriteFails(t *testing.T) {
	data, es := tornJournal(t)
	dir := writeJournal(t, data)
	var fail sync.Map
	fail.Store("short:"+asideTmpName, true)
	o := testOpts()
	o.hooks = faultyHooks(&fail)
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	defer s.Close()
	assert.True(t, rep.TornTail)
	assert.Empty(t, rep.TornCopy)
	assert.ErrorIs(t, rep.TornCopyErr, errNoSpace)
	assert.Empty(t, asideFiles(t, dir))
	assert.Equal(t, len(es), rep.Records)
}

// Pruning keeps the newest copies, the new one included. (Until the module
// had a first release, empty copies that earlier versions could leave were
// pruned first; no version of this format leaves one.)
func TestPruneKeepsNewestCopies(t *testing.T) {
	data, _ := tornJournal(t)
	dir := writeJournal(t, data)
	old := []string{tornPrefix + "20200101T000000.000000001", tornPrefix + "20200101T000000.000000002",
		tornPrefix + "20210101T000000.000000001", tornPrefix + "20210101T000000.000000002"}
	for _, n := range old {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("a torn tail"), 0o600))
	}
	s, rep, err := openWith(dir, testOpts())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	files := asideFiles(t, dir)
	assert.Len(t, files, 3, "%v", files)
	assert.Contains(t, files, filepath.Base(rep.TornCopy))
	for _, n := range old[2:] {
		assert.Contains(t, files, n, "a newer copy was pruned")
	}
}

// A salvage still refuses to go on without its copy of the damaged file:
// the copy is the only trace of acknowledged records it drops.
func TestSalvageCopyFailsOpen(t *testing.T) {
	data, _ := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	dir := writeJournal(t, flipBit(data, offs[3]+20, 3))
	var fail sync.Map
	fail.Store("short:"+asideTmpName, true)
	o := testOpts()
	o.salvage = true
	o.hooks = faultyHooks(&fail)
	_, _, err := openWith(dir, o)
	require.True(t, errors.Is(err, errNoSpace), "%v", err)
	assert.Empty(t, asideFiles(t, dir))
	_, _, err = openWith(dir, testOpts())
	assert.ErrorIs(t, err, ErrCorrupt, "the journal was changed")
}
