//go:build unix

package filejournal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHW4LockHeldNoFalsePositive: the check each batch that LOCK is still
// the file locked (lockHeld) must not stop a healthy journal: two Journals
// in one process on different directories, opened and closed in turn; a
// directory named through a symlink; a relative path and a chdir after
// Open; a LOCK with wide permissions that Open narrows; a second Open
// refused while the first holds the lock (it opens LOCK too). Each keeps
// taking records, through compactions, and every record is there after a
// reopen.
func TestHW4LockHeldNoFalsePositive(t *testing.T) {
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
