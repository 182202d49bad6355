package filejournal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// fingerprint.key deleted while its Journal is open: the Journal makes it
// again, of the secret it holds, so that the keyed fingerprints it records
// can still be checked after a restart.

// spawnSecretChild starts the child test run on the journal in dir, and
// returns it with the secret (hex) it says first ("secret <hex>").
func spawnSecretChild(t *testing.T, run, dir string) (*exec.Cmd, *lines, string) {
	t.Helper()
	cmd, l := spawnLines(t, run, envDir+"="+dir)
	first := l.waitFirst(t)
	f := strings.Fields(first)
	require.Len(t, f, 2, first)
	require.Equal(t, "secret", f[0], first)
	return cmd, l, f[1]
}

// awaitFile waits until something is at path, for as long as a few checks
// of fingerprint.key take at the most, and reports whether it came.
func awaitFile(path string) bool {
	for deadline := time.Now().Add(3*secretCheckEvery + 5*time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Lstat(path); err == nil {
			return true
		}
	}
	return false
}

// requireSecretAfterKill SIGKILLs the child (which must not have ended by
// itself) and requires the journal in dir to open with the secret it said,
// not a new one. The caller closes the journal.
func requireSecretAfterKill(t *testing.T, cmd *exec.Cmd, l *lines, dir, said, why string) *Journal {
	t.Helper()
	require.False(t, l.killWithin(cmd, 0), "the child ended by itself: %v", l.all)
	j, s, ok := openSecret(t, dir)
	require.True(t, ok, "%v", j.Recovery().FingerprintSecretErr)
	require.False(t, j.Recovery().FingerprintSecretMade, "a new secret was made: %s", why)
	require.Equal(t, said, fmt.Sprintf("%x", s))
	return j
}

// openDeletedOnFullDisk opens a journal on a small file system, writes a
// record, deletes fingerprint.key and fills the file system: the key can
// then not be made again until there is room.
func openDeletedOnFullDisk(t *testing.T) (j *Journal, mnt, dir string, secret [32]byte) {
	t.Helper()
	mnt = smallFS(t)
	dir = filepath.Join(mnt, "j")
	j, secret, ok := openSecret(t, dir)
	require.True(t, ok)
	reserve(t, j, entry("pay:0"))
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	fill(t, mnt)
	return j, mnt, dir, secret
}

// At Close.
func TestSecretDeletedWhileOpenKeptAtClose(t *testing.T) {
	dir := t.TempDir()
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	reserve(t, j, entry("pay:after-delete"))
	require.NoError(t, j.Close())
	requireSecret(t, dir, s)
}

// While it runs, within secretCheckEvery of a batch: a process SIGKILLed
// after that leaves the same secret, and its keyed records checkable.
func TestSecretDeletedWhileOpenKeptThroughKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a child")
	}
	dir := t.TempDir()
	cmd, l, said := spawnSecretChild(t, "TestSecretDeletedChild", dir)
	path := filepath.Join(dir, secretName)
	require.NoError(t, os.Remove(path))
	require.True(t, awaitFile(path), "fingerprint.key not made again while the child ran")
	j := requireSecretAfterKill(t, cmd, l, dir, said, "the records written after the deletion cannot be checked")
	require.NoError(t, j.Close())
}

// TestSecretDeletedChild is the child of
// TestSecretDeletedWhileOpenKeptThroughKill: it says its secret, then
// reserves a record every 50 ms until it is killed.
func TestSecretDeletedChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("a child of TestSecretDeletedWhileOpenKeptThroughKill")
	}
	dir := os.Getenv(envDir)
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	fmt.Printf("secret %x\n", s)
	for i := 0; ; i++ {
		if _, _, err := j.Reserve(context.Background(), entry(fmt.Sprintf("pay:%d", i)), journal.ReuseAny); err != nil {
			fmt.Printf("error %v\n", err)
			os.Exit(1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A fingerprint.key of another content, put there while the Journal is
// open, is left as it is, as Open leaves it.
func TestSecretReplacedWhileOpenLeft(t *testing.T) {
	dir := t.TempDir()
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	other := s
	other[0] ^= 1
	path := filepath.Join(dir, secretName)
	require.NoError(t, os.WriteFile(path, encodeSecret(other), 0o600))
	reserve(t, j, entry("pay:after-replace"))
	require.NoError(t, j.Close())
	requireSecret(t, dir, other)
}

// fingerprint.key deleted while open and not made again by Close (a full
// disk): Close says so, naming the file, since the next Open will make a
// new secret under which the keyed records cannot be checked. The records
// themselves are durable: the error is no ErrClosed.
func TestSecretNotKeptAtCloseIsReported(t *testing.T) {
	j, _, _, _ := openDeletedOnFullDisk(t)
	err := j.Close()
	require.Error(t, err, "Close kept quiet about a fingerprint secret it could not keep")
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Contains(t, err.Error(), secretName)
	require.NotErrorIs(t, err, journal.ErrClosed, "the journal itself is whole")
}

// A fingerprint.key.tmp left beside a fingerprint.key that reads whole (a
// crash long ago, the key restored since) is stale: Open removes it. Kept,
// it would be taken for the secret in use after a later deletion while
// closed, and a new secret would come in with no FingerprintSecretMade to
// say so.
func TestSecretStaleTmpRemovedWhenKeyIsWhole(t *testing.T) {
	dir := t.TempDir()
	s := makeSecret(t, dir)
	stale := s
	stale[0] ^= 1
	require.NoError(t, os.WriteFile(filepath.Join(dir, secretTmpName), encodeSecret(stale), 0o600))
	requireSecret(t, dir, s)
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	j, s2, ok := openSecret(t, dir)
	require.True(t, ok)
	require.True(t, j.Recovery().FingerprintSecretMade, "a stale tmp was taken for the deleted secret, and no new secret was reported")
	require.NotEqual(t, stale, s2)
	require.NoError(t, j.Close())
}
