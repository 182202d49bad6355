package filejournal

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// Adversarial tests of keepSecret (fingerprint.key made again while the
// Journal is open), with real faults.

// The journal's directory moved away and another directory made at its
// path (a reset by rm -rf and mkdir, a volume mounted over it, a symlink
// repointed): the Journal is no longer that directory's, and Close must
// not leave this journal's secret in it, where the next journal opened
// there would take it for its own. Close comes within a second of the
// last write, so that it has nothing left to write.
func TestSecretNotWrittenIntoReplacedDir(t *testing.T) {
	for _, replacement := range []string{"empty", "journal"} {
		t.Run(replacement, func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "j")
			j, s, ok := openSecret(t, dir)
			require.True(t, ok)
			reserve(t, j, entry("pay:1"))
			require.NoError(t, os.Rename(dir, filepath.Join(base, "moved")))
			require.NoError(t, os.Mkdir(dir, 0o700))
			if replacement == "journal" {
				// Another journal, closed, whose fingerprint.key is lost.
				o, err := Open(dir)
				require.NoError(t, err)
				reserve(t, o, entry("pay:other"))
				require.NoError(t, o.Close())
				require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
			}
			err := j.Close()
			require.ErrorIs(t, err, ErrRemoved)
			require.ErrorIs(t, err, journal.ErrClosed)
			_, err = os.Lstat(filepath.Join(dir, secretName))
			require.ErrorIs(t, err, os.ErrNotExist, "the closed journal's secret was written into the directory that replaced it")
			_, err = os.Lstat(filepath.Join(dir, secretTmpName))
			require.ErrorIs(t, err, os.ErrNotExist)
			// The directory that replaced it gets a secret of its own.
			o, so, ok := openSecret(t, dir)
			require.True(t, ok)
			require.NotEqual(t, s, so)
			require.NoError(t, o.Close())
			// The moved journal keeps its own.
			requireSecret(t, filepath.Join(base, "moved"), s)
		})
	}
}

// fingerprint.key deleted, then one batch written within secretCheckEvery
// of the last check, then nothing: the check that batch skipped must still
// come, or a process SIGKILLed any time later (an hour later) has lost the
// secret of the records written since the deletion, though they were
// written more than a second before the kill.
func TestSecretDeletedThenIdleKeptThroughKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a child")
	}
	dir := t.TempDir()
	cmd, l, said := spawnSecretChild(t, "TestSecretDeletedIdleChild", dir)
	awaitFile(filepath.Join(dir, secretName)) // or not: the open below tells
	j := requireSecretAfterKill(t, cmd, l, dir, said, "the records written after the deletion cannot be checked")
	require.Equal(t, 2, j.Recovery().Records)
	require.NoError(t, j.Close())
}

// TestSecretDeletedIdleChild is the child of
// TestSecretDeletedThenIdleKeptThroughKill: one record (its batch checks
// fingerprint.key), fingerprint.key deleted, one more record at once (well
// within secretCheckEvery of that check), its
// secret said, then idle until it is killed.
func TestSecretDeletedIdleChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("a child of TestSecretDeletedThenIdleKeptThroughKill")
	}
	dir := os.Getenv(envDir)
	// Lazy writes flushed within 100 ms: the flush timer's batches come
	// before secretCheckEvery has passed, and do not check either.
	j, s, ok := openSecret(t, dir, WithFlushInterval(secretCheckEvery/10))
	require.True(t, ok)
	reserve(t, j, entry("pay:0"))
	// The committer checks after it acknowledged the batch: let it.
	time.Sleep(secretCheckEvery / 5)
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	reserve(t, j, entry("pay:1"))
	fmt.Printf("secret %x\n", s)
	select {}
}

// The journal's directory removed (os.RemoveAll) as soon as a write is
// acknowledged, as the removal tests do: the check of fingerprint.key
// must not race the removal and leave a file in the directory meanwhile
// (os.RemoveAll: "directory not empty").
func TestSecretCheckDoesNotRaceRemoval(t *testing.T) {
	base := t.TempDir()
	for i := range 200 {
		dir := filepath.Join(base, fmt.Sprint(i))
		j, _, ok := openSecret(t, dir)
		require.True(t, ok)
		reserve(t, j, entry("pay:1"))
		require.NoError(t, os.RemoveAll(dir), "round %d", i)
		require.ErrorIs(t, j.Close(), ErrRemoved)
		_, err := os.Lstat(dir)
		require.ErrorIs(t, err, os.ErrNotExist, "round %d: made again after its removal", i)
	}
}

// A full disk when fingerprint.key must be made again: the failed attempt
// leaves no fingerprint.key.tmp, the journal goes on (its own appends fit
// in the page it already has), and once there is room the next check
// makes fingerprint.key of the same secret.
func TestSecretKeptFullDiskRetried(t *testing.T) {
	j, mnt, dir, s := openDeletedOnFullDisk(t)
	tmp, path := filepath.Join(dir, secretTmpName), filepath.Join(dir, secretName)
	// Two checks' worth of batches, each one appended in place.
	for i := 1; i <= 3; i++ {
		reserve(t, j, entry(fmt.Sprintf("pay:%d", i)))
		time.Sleep(secretCheckEvery)
		// An attempt may be under way (its tmp exists until its write
		// fails): a tmp left behind is one that stays.
		for gone := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			_, err := os.Lstat(tmp)
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			require.True(t, time.Now().Before(gone), "a failed attempt left fingerprint.key.tmp: %v", err)
		}
		_, err := os.Lstat(path)
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	require.NoError(t, os.Remove(filepath.Join(mnt, "filler")))
	reserve(t, j, entry("pay:room"))
	deadline := time.Now().Add(3*secretCheckEvery + 5*time.Second)
	for {
		if _, err := os.Lstat(path); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "fingerprint.key not made once there was room")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, j.Close())
	requireSecret(t, dir, s)
}

// fingerprint.key a symlink to the secret kept elsewhere, its target
// removed while the Journal is open (a volume unmounted): the dangling
// link is left, and nothing is written through it or beside it.
func TestSecretSymlinkDanglingWhileOpenLeft(t *testing.T) {
	dir, keys := t.TempDir(), t.TempDir()
	s := makeSecret(t, dir)
	path, target := filepath.Join(dir, secretName), filepath.Join(keys, "fp.key")
	require.NoError(t, os.Rename(path, target))
	require.NoError(t, os.Symlink(target, path))
	j, s2, ok := openSecret(t, dir)
	require.True(t, ok)
	require.Equal(t, s, s2)
	require.NoError(t, os.Remove(target))
	reserve(t, j, entry("pay:0"))
	time.Sleep(secretCheckEvery)
	reserve(t, j, entry("pay:1"))
	require.NoError(t, j.Close())
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	require.Equal(t, os.ModeSymlink, fi.Mode().Type())
	_, err = os.Lstat(target)
	require.ErrorIs(t, err, os.ErrNotExist, "written through the dangling link")
	_, err = os.Lstat(filepath.Join(dir, secretTmpName))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// SIGKILLed inside keepSecret's writeSecret, after fingerprint.key.tmp is
// written and synced, before its rename: the secret in use is whole on
// disk, under the temporary name. The next Open must take it, not make a
// new secret (and remove the tmp) under which the journal's keyed
// records, written before and after the deletion, cannot be checked.
func TestSecretKilledBeforeRenameKept(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a child")
	}
	dir := t.TempDir()
	cmd, l, said := spawnSecretChild(t, "TestSecretKilledBeforeRenameChild", dir)
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	// The child says "synced" at the hook and stops there.
	deadline := time.Now().Add(3*secretCheckEvery + 10*time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(dir, secretTmpName))
		if len(b) == secretFileSize {
			break
		}
		require.True(t, time.Now().Before(deadline), "the child made no fingerprint.key.tmp")
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let it reach the hook
	_, err := os.Lstat(filepath.Join(dir, secretName))
	require.ErrorIs(t, err, os.ErrNotExist, "the child went past the rename")
	j := requireSecretAfterKill(t, cmd, l, dir, said, "though the one in use was whole in fingerprint.key.tmp")
	require.NoError(t, j.Close())
	_, err = os.Lstat(filepath.Join(dir, secretTmpName))
	require.ErrorIs(t, err, os.ErrNotExist)
	b, err := hex.DecodeString(said)
	require.NoError(t, err)
	requireSecret(t, dir, [32]byte(b))
}

// TestSecretKilledBeforeRenameChild is the child of
// TestSecretKilledBeforeRenameKept: it says its secret, then reserves a
// record every 50 ms; writeSecret stops at its hook until it is killed.
func TestSecretKilledBeforeRenameChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("a child of TestSecretKilledBeforeRenameKept")
	}
	dir := os.Getenv(envDir)
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	// Set after Open, whose writeSecret made fingerprint.key; only the
	// committer calls it from now on.
	secretTestHook = func(step string) {
		if step == "synced" {
			select {}
		}
	}
	fmt.Printf("secret %x\n", s)
	for i := 0; ; i++ {
		// Reserve blocks once the committer stops at the hook.
		go func() { _, _, _ = j.Reserve(context.Background(), entry(fmt.Sprintf("pay:%d", i)), journal.ReuseAny) }()
		time.Sleep(50 * time.Millisecond)
	}
}
