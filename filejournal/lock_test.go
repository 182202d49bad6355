package filejournal

import (
	"context"
	"fmt"
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

// Tests of the directory's lock (LOCK, internal/lockfile): its errors, a
// LOCK removed while open, and no false alarm from the check of it.

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
	t.Parallel()
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
	t.Parallel()
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
	us := reserveSome(t, s, "u", 8)
	fill(t, mnt)
	_, err = reserveUntilFull(t, s, "full")
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, journalName))
	doneAll(t, s, us, 201)
	err = s.Close()
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, journalName))
}

// Issue 30, item 5: LOCK that cannot be made (no inode left: ENOSPC, as
// on a full disk) said "open D: lockfile: open: open D/LOCK".
func TestLockFileOnFullDiskNamedOnce(t *testing.T) {
	t.Parallel()
	mnt := smallFSOf(t, "64k,nr_inodes=2") // the root and j
	dir := filepath.Join(mnt, "j")
	require.NoError(t, os.Mkdir(dir, 0o700))
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, syscall.ENOSPC)
	requireOnce(t, err, dir, filepath.Join(dir, lockName))
	assert.NotContains(t, err.Error(), "lockfile")
}

// TestLockRemovedWhileOpen: LOCK deleted (a cleanup of "stale" lock
// files), or deleted and made again, while a Journal holds it. The lock
// is on the deleted inode, so a second Open, in this process or another,
// makes a new LOCK and gets it: two Journals on one file. The first must
// then write nothing more: its next batch fails (ErrRemoved, and it
// stops) instead of appending frames among the other's. Before the fix
// both appended: the first one's Reserve was acknowledged, and the journal
// then failed to open ("bytes that are no frame before frame 4"), every
// record after the damage lost but to a salvage.
func TestLockRemovedWhileOpen(t *testing.T) {
	t.Parallel()
	for _, remade := range []bool{false, true} {
		dir := t.TempDir()
		ctx := context.Background()
		a, _ := mustOpen(t, dir, testOpts())
		a1 := reserve(t, a, entry("a1"))
		require.NoError(t, os.Remove(filepath.Join(dir, lockName)))
		if remade {
			require.NoError(t, os.WriteFile(filepath.Join(dir, lockName), nil, 0o600))
		}
		b, _, err := openWith(dir, testOpts())
		require.NoError(t, err, "the lock is gone with its file: nothing stops this Open")
		b1 := reserve(t, b, entry("b1"))

		_, _, err = a.Reserve(ctx, entry("a2"), journal.ReuseAny)
		require.ErrorIs(t, err, ErrRemoved, "remade %v: a Reserve of the Journal whose LOCK was removed", remade)
		require.ErrorIs(t, err, journal.ErrClosed)
		require.Error(t, a.Close())

		b2 := reserve(t, b, entry("b2"))
		require.NoError(t, b.Close())
		c, rep, err := openWith(dir, testOpts())
		require.NoError(t, err, "remade %v", remade)
		require.False(t, rep.TornTail)
		for _, want := range []journal.Record{a1, b1, b2} {
			got, ok, err := c.Get(ctx, want.ActionID)
			require.NoError(t, err)
			require.True(t, ok, "%s", want.ActionID)
			require.Equal(t, want.Key, got.Key)
		}
		_, ok, err := c.Get(ctx, "a2")
		require.NoError(t, err)
		require.False(t, ok)
		require.NoError(t, c.Close())
	}
}

// TestLockHeldNoFalsePositive: the check each batch that LOCK is still
// the file locked (lockHeld) must not stop a healthy journal: two Journals
// in one process on different directories, opened and closed in turn; a
// directory named through a symlink; a relative path and a chdir after
// Open; a LOCK with wide permissions that Open narrows; a second Open
// refused while the first holds the lock (it opens LOCK too). Each keeps
// taking records, through compactions, and every record is there after a
// reopen.
func TestLockHeldNoFalsePositive(t *testing.T) {
	onlyOnUnix(t)
	ctx := context.Background()
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	require.NoError(t, os.MkdirAll(a, 0o700))
	require.NoError(t, os.MkdirAll(b, 0o700))
	// b's LOCK exists with wide permissions, for Open to narrow.
	require.NoError(t, os.WriteFile(filepath.Join(b, lockName), nil, 0o644))
	require.NoError(t, os.Chmod(filepath.Join(b, lockName), 0o666))
	link := filepath.Join(root, "link")
	require.NoError(t, os.Symlink(a, link))

	ids := map[string][]string{}
	use := func(j *Journal, dir string, n int) {
		t.Helper()
		for i := range n {
			id := fmt.Sprintf("%s-%d-%d", filepath.Base(dir), len(ids[dir]), i)
			reserve(t, j, entry(id))
			ids[dir] = append(ids[dir], id)
		}
		require.NoError(t, j.Sync(ctx))
		require.NoError(t, j.Compact(ctx))
		reserve(t, j, entry(filepath.Base(dir)+"-after-"+fmt.Sprint(len(ids[dir]))))
		ids[dir] = append(ids[dir], filepath.Base(dir)+"-after-"+fmt.Sprint(len(ids[dir])))
	}

	ja, _ := mustOpen(t, link, testOpts()) // a, through the symlink
	jb, _ := mustOpen(t, b, testOpts())
	fi, err := os.Stat(filepath.Join(b, lockName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "Open narrows LOCK")
	use(ja, a, 20)
	use(jb, b, 20)
	// A second Open of each is refused, having opened LOCK itself.
	for _, d := range []string{a, b} {
		o := testOpts()
		o.lockWait = 0
		_, _, err := openWith(d, o)
		require.Error(t, err)
		require.ErrorIs(t, err, ErrLocked)
	}
	use(ja, a, 5)
	use(jb, b, 5)
	require.NoError(t, ja.Close())
	use(jb, b, 5) // b goes on while a is closed and reopened
	ja, _ = mustOpen(t, a, testOpts())
	use(ja, a, 5)
	require.NoError(t, jb.Close())
	use(ja, a, 5)

	// A relative path, then a chdir.
	t.Chdir(root)
	jb, _ = mustOpen(t, "b", testOpts())
	t.Chdir(a)
	use(jb, b, 5)
	use(ja, a, 5)
	require.NoError(t, ja.Close())
	require.NoError(t, jb.Close())

	for _, d := range []string{a, b} {
		j, _ := mustOpen(t, d, testOpts())
		for _, id := range ids[d] {
			_, ok, err := j.Get(ctx, id)
			require.NoError(t, err)
			require.True(t, ok, "%s in %s", id, d)
		}
		require.NoError(t, j.Close())
	}
}
