package filejournal

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireOnce requires each of paths to appear exactly once in err's
// message (a path inside another counts as an appearance of both).
func requireOnce(t *testing.T, err error, paths ...string) {
	t.Helper()
	require.Error(t, err)
	for _, p := range paths {
		assert.Equal(t, 1, strings.Count(err.Error(), p), "%q in %q", p, err)
	}
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), "the package prefix, once: %q", err)
}

// Issue 30, item 5: the lock error said "wait with WithLockWait", an
// option the Transport's user reaches only through WithJournalDir. It
// names it fully, and how to pass it.
func TestLockErrorNamesTheWaitOption(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	defer s.Close()
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), "filejournal.WithLockWait")
	assert.Contains(t, err.Error(), "idemretry.WithJournalDir")
	requireOnce(t, err, dir)
}

// Issue 30, item 5: on a full disk, the errors of Open printed their
// path twice ("write P: write P: no space left on device", "open D: ...
// open D/LOCK"). Each path now appears once, in an error that still
// matches ENOSPC, from Open (the journal's creation, and LOCK's), Reserve
// and Close.
func TestFullDiskErrorsNamePathsOnce(t *testing.T) {
	mnt := smallFSOf(t, "64k")
	dir := filepath.Join(mnt, "j")
	fill(t, mnt)
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, tmpName))
	unfill(t, mnt)

	o := testOpts()
	o.flushEvery = time.Hour
	s, _ := mustOpen(t, dir, o)
	t.Cleanup(func() { _ = s.Close() }) // before the unmount, on a failure
	a := reserve(t, s, entry("a"))
	fill(t, mnt)
	_, err = reserveUntilFull(t, s, "full")
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, journalName))
	a.State, a.Attempts, a.Status = journal.StateDone, 1, 201
	require.NoError(t, s.Update(context.Background(), a))
	err = s.Close()
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, journalName))
}

// Issue 30, item 5: LOCK that cannot be made (no inode left: ENOSPC, as
// on a full disk) said "open D: lockfile: open: open D/LOCK".
func TestLockFileOnFullDiskNamedOnce(t *testing.T) {
	mnt := smallFSOf(t, "64k,nr_inodes=2") // the root and j
	dir := filepath.Join(mnt, "j")
	require.NoError(t, os.Mkdir(dir, 0o700))
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, lockName))
	assert.NotContains(t, err.Error(), "lockfile")
}
