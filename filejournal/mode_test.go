//go:build unix

package filejournal_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/filejournal"
)

// Issue 7, item 16: the README says the journal directory is 0700 and its
// files 0600. A directory (and journal) made wider by hand or by an older
// setup is tightened when the process owns it, and the Recovery says so.
func TestJournalModesTightened(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "j")
	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	for name, mode := range map[string]os.FileMode{"": 0o777, "journal": 0o666, "LOCK": 0o644} {
		require.NoError(t, os.Chmod(filepath.Join(dir, name), mode))
	}

	j, err = filejournal.Open(dir)
	require.NoError(t, err)
	defer j.Close()
	for name, want := range map[string]os.FileMode{"": 0o700, "journal": 0o600, "LOCK": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, want, fi.Mode().Perm(), "mode of %q", filepath.Join(dir, name))
	}
	assert.ElementsMatch(t, []string{dir, filepath.Join(dir, "journal"), filepath.Join(dir, "LOCK")}, j.Recovery().ModeTightened)
	assert.Empty(t, j.Recovery().ModeNotOwned)
}

// A directory the process does not own is left as it is (chmod would fail
// for anyone but root, and changing another user's directory is not the
// journal's business), and reported.
func TestJournalModeNotOwnedReported(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("making a directory another user owns needs root")
	}
	dir := filepath.Join(t.TempDir(), "j")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, 0o777))
	require.NoError(t, os.Chown(dir, 65534, 65534))
	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	defer j.Close()
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o777), fi.Mode().Perm())
	assert.Equal(t, []string{dir}, j.Recovery().ModeNotOwned)
	assert.Empty(t, j.Recovery().ModeTightened)
}
