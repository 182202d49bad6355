package filejournal

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
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
	a := t.TempDir()
	s := makeSecret(t, a)
	b := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(a, secretName), filepath.Join(b, secretName)))
	requireSecret(t, b, s)
}

// A symlinked fingerprint.key already 0600 is not "tightened" at every
// Open (tighten reads the link's own mode, 0777, and chmods the target).
func TestSecretSymlinkNotReportedTightened(t *testing.T) {
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
