package filejournal

// Review hT1: fingerprint.key.tmp taken by Open (adoptSecretTmp).

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/stretchr/testify/require"
)

// fingerprint.key deleted while the journal is closed, then the Open that
// makes a new secret SIGKILLed after its fingerprint.key.tmp is synced,
// before the rename: that tmp holds a secret no record was made with. The
// next Open must say that it made a new secret for a journal that holds
// records (Recovery.FingerprintSecretMade, which the Transport logs), as
// it would had the first Open not been killed; taking the tmp as if it were
// the secret in use (keepSecret's) made the new secret silently, and the
// keyed records made under the deleted one refused with nothing logged.
func TestSecretOpenKilledAfterTmpSyncReportsNew(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a child")
	}
	dir := t.TempDir()
	j, old, ok := openSecret(t, dir)
	require.True(t, ok)
	reserve(t, j, entry("pay:keyed-under-old"))
	require.NoError(t, j.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))

	cmd, l := spawnLines(t, "TestSecretOpenKilledChildHT1", envDir+"="+dir)
	first := l.waitFirst(t)
	require.Equal(t, "synced", first)
	byItself := l.killWithin(cmd, 0) // l.all is read only after it
	require.False(t, byItself, "the child ended by itself: %v", l.all)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	t.Logf("left by the killed Open: %v", names)
	_, err = os.Lstat(filepath.Join(dir, secretName))
	require.ErrorIs(t, err, os.ErrNotExist)

	j, s, ok := openSecret(t, dir)
	require.True(t, ok, "%v", j.Recovery().FingerprintSecretErr)
	require.NotEqual(t, old, s)
	require.Equal(t, 1, j.Recovery().Records)
	require.True(t, j.Recovery().FingerprintSecretMade,
		"a new secret replaced the deleted one for a journal of %d records, and Recovery does not say so", j.Recovery().Records)
	require.NoError(t, j.Close())
	requireSecret(t, dir, s)
	for _, n := range names {
		if strings.HasPrefix(n, secretName+".") {
			_, err := os.Lstat(filepath.Join(dir, n))
			require.ErrorIs(t, err, os.ErrNotExist, "%s left", n)
		}
	}
}

// TestSecretOpenKilledChildHT1 is the child of
// TestSecretOpenKilledAfterTmpSyncReportsNew: its Open makes a new
// fingerprint.key and stops at writeSecret's hook, after the tmp is
// synced, saying "synced", until it is killed.
func TestSecretOpenKilledChildHT1(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("a child of TestSecretOpenKilledAfterTmpSyncReportsNew")
	}
	dir := os.Getenv(envDir)
	secretTestHook = func(step string) {
		if step == "synced" {
			fmt.Println("synced")
			select {}
		}
	}
	j, err := Open(dir)
	fmt.Printf("error: Open returned (%v)\n", err)
	if err == nil {
		_ = j.Close()
	}
}

// Close's error for a fingerprint.key it could not make again says
// "close" once, with the "idemretry: " prefix once, and unwraps to the file
// system's error (errors.Is ENOSPC); it was "idemretry: journal close:
// journal: close: fingerprint.key deleted ...".
func TestSecretNotKeptAtCloseMessageHT1(t *testing.T) {
	mnt := smallFS(t)
	dir := filepath.Join(mnt, "j")
	j, _, ok := openSecret(t, dir)
	require.True(t, ok)
	reserve(t, j, entry("pay:0"))
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	fill(t, mnt)
	err := j.Close()
	require.ErrorIs(t, err, syscall.ENOSPC)
	msg := err.Error()
	require.Equal(t, 1, strings.Count(msg, "idemretry: "), msg)
	require.True(t, strings.HasPrefix(msg, "idemretry: journal close: "+secretName+" deleted and not made again"), msg)
}

// fingerprint.key deleted while another process holds the journal, this one
// waiting on its lock (WithLockWait): the holder's Close makes it again
// before it lets go of the lock, so the waiter's Open reads the secret in
// use, not a new one.
func TestSecretDeletedWhileHeldByOtherProcessHT1(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child")
	}
	dir := t.TempDir()
	cmd, l := spawnLines(t, "TestSecretKillChild", envDir+"="+dir, envTag+"=hold")
	first := l.waitFirst(t)
	require.True(t, strings.HasPrefix(first, "secret "), first)
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	j, s, ok := openSecret(t, dir, WithLockWait(60*time.Second))
	require.True(t, ok, "%v", j.Recovery().FingerprintSecretErr)
	require.False(t, j.Recovery().FingerprintSecretMade)
	require.Equal(t, strings.TrimPrefix(first, "secret "), hex.EncodeToString(s[:]))
	require.NoError(t, j.Close())
	require.True(t, l.killWithin(cmd, 30*time.Second), "the child did not end by itself")
	require.True(t, cmd.ProcessState.Success(), "the child failed: %v", l.all)
}
