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

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// fingerprint.key deleted while its Journal is open: the Journal makes it
// again, of the secret it holds, so that the keyed fingerprints it records
// can still be checked after a restart.

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
	cmd, l := spawnLines(t, "TestSecretDeletedChild", envDir+"="+dir)
	first := l.waitFirst(t)
	f := strings.Fields(first)
	require.Equal(t, "secret", f[0], first)
	path := filepath.Join(dir, secretName)
	require.NoError(t, os.Remove(path))
	deadline := time.Now().Add(3*secretCheckEvery + 5*time.Second)
	for {
		if _, err := os.Lstat(path); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "fingerprint.key not made again while the child ran")
		time.Sleep(20 * time.Millisecond)
	}
	require.False(t, l.killWithin(cmd, 0), "the child ended by itself: %v", l.all)
	j, s, ok := openSecret(t, dir)
	require.True(t, ok, "%v", j.Recovery().FingerprintSecretErr)
	require.False(t, j.Recovery().FingerprintSecretMade, "a new secret was made")
	require.Equal(t, f[1], fmt.Sprintf("%x", s))
	require.NoError(t, j.Close())
}

// TestSecretDeletedChild is the child of
// TestSecretDeletedWhileOpenKeptThroughKill: it says its secret, then
// reserves a record every 50 ms until it is killed.
func TestSecretDeletedChild(t *testing.T) {
	dir := os.Getenv(envDir)
	if dir == "" {
		t.Skip("a child of TestSecretDeletedWhileOpenKeptThroughKill")
	}
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
	mnt := smallFS(t)
	dir := filepath.Join(mnt, "j")
	j, _, ok := openSecret(t, dir)
	require.True(t, ok)
	reserve(t, j, entry("pay:0"))
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	fill(t, mnt)
	err := j.Close()
	require.Error(t, err, "Close kept quiet about a fingerprint secret it could not keep")
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Contains(t, err.Error(), secretName)
	require.NotErrorIs(t, err, journal.ErrClosed, "the journal itself is whole")
}
