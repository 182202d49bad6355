package filejournal

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Fault tests of fingerprint.key (secret.go), with real faults: damaged
// bytes, a crash before the rename, SIGKILLed children, a full disk.

func openSecret(t *testing.T, dir string, opts ...Option) (*Journal, [32]byte, bool) {
	t.Helper()
	j, err := Open(dir, opts...)
	require.NoError(t, err)
	s, ok := j.FingerprintSecret(j)
	return j, s, ok
}

// makeSecret opens the journal in dir, which must then have a secret (read
// or made), closes it and returns the secret.
func makeSecret(t *testing.T, dir string) [32]byte {
	t.Helper()
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	require.NoError(t, j.Close())
	return s
}

// requireSecret opens dir's journal, requires its secret to be want, and
// closes it.
func requireSecret(t *testing.T, dir string, want [32]byte) {
	t.Helper()
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	require.Equal(t, want, s)
	require.NoError(t, j.Close())
}

func TestSecretReopenSameOtherDirOther(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, s1, ok := openSecret(t, dir)
	require.True(t, ok)
	require.NoError(t, j.Recovery().FingerprintSecretErr)
	require.NotEqual(t, [32]byte{}, s1)
	require.NoError(t, j.Close())
	path := filepath.Join(dir, secretName)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.EqualValues(t, secretFileSize, fi.Size())
	_, err = os.Stat(filepath.Join(dir, secretTmpName))
	require.ErrorIs(t, err, os.ErrNotExist)

	j, s2, ok := openSecret(t, dir)
	require.True(t, ok)
	require.Equal(t, s1, s2)
	require.Empty(t, j.Recovery().ModeTightened)
	require.NoError(t, j.Close())

	j, s3, ok := openSecret(t, t.TempDir())
	require.True(t, ok)
	require.NotEqual(t, s1, s3)
	require.NoError(t, j.Close())

	// Widened: tightened and listed like the others, the secret kept.
	require.NoError(t, os.Chmod(path, 0o644))
	j, s4, ok := openSecret(t, dir)
	require.True(t, ok)
	require.Equal(t, s1, s4)
	require.Contains(t, j.Recovery().ModeTightened, path)
	require.NoError(t, j.Close())
	fi, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

// requireNoSecret checks that Open of dir succeeds without a secret, with
// a *CorruptionError naming fingerprint.key, and leaves its bytes as they
// were (want).
func requireDamagedSecret(t *testing.T, dir string, want []byte) {
	t.Helper()
	path := filepath.Join(dir, secretName)
	for range 2 { // and the second Open does not replace it either
		j, s, ok := openSecret(t, dir)
		require.False(t, ok)
		require.Equal(t, [32]byte{}, s)
		err := j.Recovery().FingerprintSecretErr
		require.ErrorIs(t, err, ErrCorrupt)
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, path, ce.Path)
		require.Contains(t, err.Error(), secretName)
		require.NoError(t, j.Close())
		got, rerr := os.ReadFile(path)
		require.NoError(t, rerr)
		require.Equal(t, want, got)
	}
}

func TestSecretDamaged(t *testing.T) {
	t.Parallel()
	n := len(secretMagic)
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
		{"truncated-to-magic", func(b []byte) []byte { return b[:n] }},
		{"empty", func(b []byte) []byte { return b[:0] }},
		{"extended", func(b []byte) []byte { return append(b, 0) }},
		{"flip-magic-first", func(b []byte) []byte { b[0] ^= 1; return b }},
		{"flip-magic-last", func(b []byte) []byte { b[n-1] ^= 0x80; return b }},
		{"flip-secret-first", func(b []byte) []byte { b[n] ^= 1; return b }},
		{"flip-secret-mid", func(b []byte) []byte { b[n+17] ^= 0x10; return b }},
		{"flip-secret-last", func(b []byte) []byte { b[n+31] ^= 0x80; return b }},
		{"flip-checksum-first", func(b []byte) []byte { b[n+32] ^= 1; return b }},
		{"flip-checksum-last", func(b []byte) []byte { b[secretFileSize-1] ^= 0x80; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			makeSecret(t, dir)
			path := filepath.Join(dir, secretName)
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			b = tc.damage(b)
			require.NoError(t, os.WriteFile(path, b, 0o600))
			requireDamagedSecret(t, dir, b)
		})
	}
}

// Every single-bit flip anywhere in the file is caught.
func TestSecretEveryBitFlip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	makeSecret(t, dir)
	path := filepath.Join(dir, secretName)
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	for i := range len(good) * 8 {
		b := append([]byte(nil), good...)
		b[i/8] ^= 1 << (i % 8)
		_, err := parseSecret(path, b)
		require.ErrorIs(t, err, ErrCorrupt, "bit %d", i)
	}
}

// A crash before the rename leaves fingerprint.key.tmp: the next Open makes
// a new secret and leaves no tmp, unless the tmp is whole (see
// adoptSecretTmp and TestSecretKilledBeforeRenameKept): then its secret is
// taken.
func TestSecretLeftoverTmp(t *testing.T) {
	t.Parallel()
	for _, content := range [][]byte{nil, []byte("idemretry fing"), encodeSecret([32]byte{1, 2, 3})[:secretFileSize-1]} {
		dir := t.TempDir()
		j, _, _ := openSecret(t, dir)
		require.NoError(t, j.Close())
		require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
		require.NoError(t, os.WriteFile(filepath.Join(dir, secretTmpName), content, 0o600))
		j, s, ok := openSecret(t, dir)
		require.True(t, ok)
		require.NotEqual(t, [32]byte{1, 2, 3}, s)
		require.NoError(t, j.Close())
		_, err := os.Stat(filepath.Join(dir, secretTmpName))
		require.ErrorIs(t, err, os.ErrNotExist)
		requireSecret(t, dir, s)
	}
}

// A whole fingerprint.key.tmp, fingerprint.key missing: its secret is
// taken, renamed into place; of a mode wider than the owner's, it is not.
func TestSecretWholeTmpAdopted(t *testing.T) {
	t.Parallel()
	for _, mode := range []os.FileMode{0o600, 0o400, 0o640} {
		dir := t.TempDir()
		j, _, _ := openSecret(t, dir)
		require.NoError(t, j.Close())
		require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
		tmp := filepath.Join(dir, secretTmpName)
		require.NoError(t, os.WriteFile(tmp, encodeSecret([32]byte{1, 2, 3}), 0o600))
		require.NoError(t, os.Chmod(tmp, mode))
		j, s, ok := openSecret(t, dir)
		require.True(t, ok)
		require.Equal(t, mode&0o077 != 0, j.Recovery().FingerprintSecretMade, "%v", mode)
		require.Equal(t, mode&0o077 == 0, s == [32]byte{1, 2, 3}, "%v", mode)
		require.NoError(t, j.Close())
		_, err := os.Lstat(tmp)
		require.ErrorIs(t, err, os.ErrNotExist)
		requireSecret(t, dir, s)
	}
}

// A leftover (or planted) fingerprint.key.tmp readable by others must not
// give its mode to the new fingerprint.key.
func TestSecretTmpWideModeNotInherited(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tmp := filepath.Join(dir, secretTmpName)
	require.NoError(t, os.WriteFile(tmp, []byte("x"), 0o600))
	require.NoError(t, os.Chmod(tmp, 0o644))
	makeSecret(t, dir)
	fi, err := os.Stat(filepath.Join(dir, secretName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the new secret is readable by others")
}

// A fingerprint.key.tmp that is a symlink must not be followed: the secret
// would be written to its target, and fingerprint.key become the link.
func TestSecretTmpSymlinkNotFollowed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	require.NoError(t, os.WriteFile(target, nil, 0o644))
	require.NoError(t, os.Symlink(target, filepath.Join(dir, secretTmpName)))
	makeSecret(t, dir)
	b, err := os.ReadFile(target)
	require.NoError(t, err)
	require.Empty(t, b, "the secret was written through the symlink")
	fi, err := os.Lstat(filepath.Join(dir, secretName))
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular(), "fingerprint.key is %v", fi.Mode())
}

// fingerprint.key a directory: Open succeeds without a secret, the
// directory left.
func TestSecretIsDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, secretName), 0o700))
	j, _, ok := openSecret(t, dir)
	require.False(t, ok)
	require.ErrorIs(t, j.Recovery().FingerprintSecretErr, ErrCorrupt)
	require.Contains(t, j.Recovery().FingerprintSecretErr.Error(), secretName)
	require.NoError(t, j.Close())
	fi, err := os.Stat(filepath.Join(dir, secretName))
	require.NoError(t, err)
	require.True(t, fi.IsDir())
}

// A symlink fingerprint.key to a valid secret is read through.
func TestSecretSymlinkToValid(t *testing.T) {
	t.Parallel()
	a := t.TempDir()
	s := makeSecret(t, a)
	b := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(a, secretName), filepath.Join(b, secretName)))
	requireSecret(t, b, s)
}

// A symlinked fingerprint.key already 0600 is not "tightened" at every
// Open (tighten reads the link's own mode, 0777, and chmods the target).
func TestSecretSymlinkNotReportedTightened(t *testing.T) {
	t.Parallel()
	a := t.TempDir()
	makeSecret(t, a)
	b := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(a, secretName), filepath.Join(b, secretName)))
	j, _, ok := openSecret(t, b)
	require.True(t, ok)
	require.NotContains(t, j.Recovery().ModeTightened, filepath.Join(b, secretName))
	require.NoError(t, j.Close())
}

func TestSecretUnreadable(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		t.Skip("root reads a mode 000 file")
	}
	dir := t.TempDir()
	j, _, _ := openSecret(t, dir)
	require.NoError(t, j.Close())
	path := filepath.Join(dir, secretName)
	require.NoError(t, os.Chmod(path, 0))
	t.Cleanup(func() { _ = os.Chmod(path, 0o600) })
	j, _, ok := openSecret(t, dir)
	require.False(t, ok)
	require.ErrorIs(t, j.Recovery().FingerprintSecretErr, os.ErrPermission)
	require.NoError(t, j.Close())
}

// A full disk: Open succeeds without a secret, FingerprintSecretErr says
// why, no tmp is left; once there is room the next Open makes one.
func TestSecretFullDisk(t *testing.T) {
	t.Parallel()
	mnt := smallFS(t)
	dir := filepath.Join(mnt, "j")
	makeSecret(t, dir)
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))
	fill(t, mnt)
	j, _, ok := openSecret(t, dir)
	require.False(t, ok)
	require.ErrorIs(t, j.Recovery().FingerprintSecretErr, syscall.ENOSPC)
	require.NoError(t, j.Close())
	_, err := os.Stat(filepath.Join(dir, secretName))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(dir, secretTmpName))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.Remove(filepath.Join(mnt, "filler")))
	j, _, ok = openSecret(t, dir)
	require.True(t, ok)
	require.NoError(t, j.Close())
}

// A second Open waiting on the lock sees the secret the first made.
func TestSecretLockWaitSeesFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j1, s1, ok := openSecret(t, dir)
	require.True(t, ok)
	ch := make(chan *Journal, 1)
	errc := make(chan error, 1)
	go func() {
		j2, err := Open(dir, WithLockWait(60*time.Second))
		errc <- err
		ch <- j2
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, j1.Close())
	require.NoError(t, <-errc)
	j2 := <-ch
	s2, ok := j2.FingerprintSecret(j2)
	require.True(t, ok)
	require.Equal(t, s1, s2)
	require.NoError(t, j2.Close())
}

// The same across processes: a child holds the journal (made the secret),
// the parent waits on the lock.
func TestSecretLockWaitOtherProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, l := spawnLines(t, "TestSecretKillChild", envDir+"="+dir, envTag+"=hold")
	first := l.waitFirst(t)
	require.True(t, strings.HasPrefix(first, "secret "), first)
	j, s, ok := openSecret(t, dir, WithLockWait(60*time.Second))
	require.True(t, ok)
	require.Equal(t, strings.TrimPrefix(first, "secret "), hex.EncodeToString(s[:]))
	require.NoError(t, j.Close())
	l.killWithin(cmd, 30*time.Second)
}

// TestSecretKillChild, as a child, opens fresh journal directories under
// envDir in a loop and says each secret; with envTag=hold it opens envDir
// itself, says its secret, and holds the journal a moment.
func TestSecretKillChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("a child of TestSecretKilledWhileMaking")
	}
	base := os.Getenv(envDir)
	if os.Getenv(envTag) == "hold" {
		j, s, ok := openSecret(t, base)
		require.True(t, ok)
		fmt.Printf("secret %x\n", s)
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, j.Close())
		return
	}
	for i := 0; ; i++ {
		d := filepath.Join(base, fmt.Sprint(i))
		fmt.Printf("open %d\n", i)
		j, err := Open(d)
		if err != nil {
			fmt.Printf("error %d %v\n", i, err)
			os.Exit(1)
		}
		s, ok := j.FingerprintSecret(j)
		fmt.Printf("secret %d %x %v\n", i, s, ok)
		_ = j.Close()
	}
}

// Children SIGKILLed at random points while they make secrets: every
// directory has no fingerprint.key (the next Open makes one) or a valid
// one, and a secret once returned is the one every later Open returns.
func TestSecretKilledWhileMaking(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills children")
	}
	for round := range 6 {
		base := t.TempDir()
		cmd, l := spawnLines(t, "TestSecretKillChild", envDir+"="+base)
		require.Equal(t, "open 0", l.waitFirst(t))
		l.killWithin(cmd, time.Duration(5+rand.IntN(150))*time.Millisecond)
		said := map[string]string{}
		for _, s := range l.all {
			f := strings.Fields(s)
			if f[0] == "error" {
				t.Fatalf("round %d: child: %s", round, s)
			}
			if f[0] == "secret" {
				require.Equal(t, "true", f[3], s)
				said[f[1]] = f[2]
			}
		}
		ents, err := os.ReadDir(base)
		require.NoError(t, err)
		t.Logf("round %d: %d directories, %d secrets said", round, len(ents), len(said))
		for _, e := range ents {
			d := filepath.Join(base, e.Name())
			b, err := os.ReadFile(filepath.Join(d, secretName))
			if err == nil {
				_, perr := parseSecret(filepath.Join(d, secretName), b)
				require.NoError(t, perr, "round %d dir %s: damaged fingerprint.key", round, e.Name())
			} else {
				require.ErrorIs(t, err, os.ErrNotExist)
				_, ok := said[e.Name()]
				require.False(t, ok, "round %d dir %s: a said secret is gone", round, e.Name())
			}
			j, s, ok := openSecret(t, d)
			require.True(t, ok, "round %d dir %s: %v", round, e.Name(), j.Recovery().FingerprintSecretErr)
			if want, said := said[e.Name()]; said {
				require.Equal(t, want, hex.EncodeToString(s[:]), "round %d dir %s", round, e.Name())
			}
			require.NoError(t, j.Close())
			requireSecret(t, d, s)
			_, err = os.Stat(filepath.Join(d, secretTmpName))
			require.ErrorIs(t, err, os.ErrNotExist)
		}
	}
}

var _ = errors.Is

// fingerprint.key a symlink whose target is missing (a volume not
// mounted, say): no new secret replaces the link.
func TestSecretDanglingSymlinkKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, secretName)
	target := filepath.Join(t.TempDir(), "gone", secretName)
	require.NoError(t, os.Symlink(target, path))
	_, made, err := loadSecret(dir)
	require.False(t, made)
	require.ErrorIs(t, err, os.ErrNotExist)
	got, err := os.Readlink(path)
	require.NoError(t, err)
	require.Equal(t, target, got)
}

// The same through Open. tighten (perm_unix.go) Lstats the symlink (mode
// 0777) and chmods its missing target: Open fails. Needs tighten to
// follow symlinks (os.Stat when the Lstat is a symlink; nothing to do when
// its target is missing).
func TestSecretDanglingSymlinkOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, secretName)
	target := filepath.Join(t.TempDir(), "gone", secretName)
	require.NoError(t, os.Symlink(target, path))
	j, _, ok := openSecret(t, dir)
	require.False(t, ok, "a new secret replaced the symlink")
	require.ErrorIs(t, j.Recovery().FingerprintSecretErr, os.ErrNotExist)
	require.NoError(t, j.Close())
	got, err := os.Readlink(path)
	require.NoError(t, err)
	require.Equal(t, target, got)
}

// fingerprint.key deleted while the journal is closed, then the Open that
// makes a new secret SIGKILLed after its fingerprint.key.tmp is synced,
// before the rename: that tmp holds a secret no record was made with. The
// next Open must say that it made a new secret for a journal that holds
// records (Recovery.FingerprintSecretMade, which the Transport logs), as
// it would had the first Open not been killed; taking the tmp as if it were
// the secret in use (keepSecret's) made the new secret silently, and the
// keyed records made under the deleted one refused with nothing logged.
func TestSecretOpenKilledAfterTmpSyncReportsNew(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a child")
	}
	dir := t.TempDir()
	j, old, ok := openSecret(t, dir)
	require.True(t, ok)
	reserve(t, j, entry("pay:keyed-under-old"))
	require.NoError(t, j.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, secretName)))

	cmd, l := spawnLines(t, "TestSecretOpenKilledChild", envDir+"="+dir)
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

// TestSecretOpenKilledChild is the child of
// TestSecretOpenKilledAfterTmpSyncReportsNew: its Open makes a new
// fingerprint.key and stops at writeSecret's hook, after the tmp is
// synced, saying "synced", until it is killed.
func TestSecretOpenKilledChild(t *testing.T) {
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
func TestSecretNotKeptAtCloseMessage(t *testing.T) {
	t.Parallel()
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
func TestSecretDeletedWhileHeldByOtherProcess(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// Adversarial tests of keepSecret (fingerprint.key made again while the
// Journal is open), with real faults.

// The journal's directory moved away and another directory made at its
// path (a reset by rm -rf and mkdir, a volume mounted over it, a symlink
// repointed): the Journal is no longer that directory's, and Close must
// not leave this journal's secret in it, where the next journal opened
// there would take it for its own. Close comes within a second of the
// last write, so that it has nothing left to write.
func TestSecretNotWrittenIntoReplacedDir(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
