//go:build linux

package filejournal

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/stretchr/testify/require"
)

// The secret in use whole in fingerprint.key.tmp (keepSecret SIGKILLed
// before its rename), and an Open whose rename of it succeeds but whose
// sync of the directory fails (a directory it may write and search but not
// read, so that it cannot open it to sync it; a real EACCES, in a child run
// as another user): fingerprint.key must still hold the secret in use.
// adoptSecretTmp fell through to making a new secret, which writeSecret
// renamed over the fingerprint.key it had just put in place: the secret
// every keyed record was made with was gone for good.
func TestSecretAdoptedDirSyncFailsKeepsSecret(t *testing.T) {
	t.Parallel()
	dir, s, runChild := asOtherUser(t)
	require.NoError(t, os.Chmod(dir, 0o300))
	t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
	runChild()
	require.NoError(t, os.Chmod(dir, 0o700))
	j, got, ok := openSecret(t, dir)
	require.True(t, ok, "%v", j.Recovery().FingerprintSecretErr)
	require.NoError(t, j.Close())
	require.Equal(t, hex.EncodeToString(s[:]), hex.EncodeToString(got[:]),
		"fingerprint.key no longer holds the secret the journal's keyed records were made with")
}

// The secret in use whole in fingerprint.key.tmp, and an Open that cannot
// read it (EACCES: the tmp left by a process of another user, root, as an
// operator's run under sudo leaves it; a descriptor limit would do the
// same): like an unreadable fingerprint.key, it is left as it is, and the
// Open goes on without a secret (FingerprintSecretErr). It was removed,
// and a new secret made: the secret every keyed record was made with was
// gone for good.
func TestSecretTmpUnreadableLeft(t *testing.T) {
	t.Parallel()
	dir, s, runChild := asOtherUser(t)
	require.NoError(t, os.Chown(filepath.Join(dir, secretTmpName), 0, 0))
	out := runChild()
	require.Contains(t, out, "opened 0000000000000000000000000000000000000000000000000000000000000000 false made false err ")
	require.Contains(t, out, "permission denied")
	j, got, ok := openSecret(t, dir)
	require.True(t, ok, "%v", j.Recovery().FingerprintSecretErr)
	require.NoError(t, j.Close())
	require.Equal(t, hex.EncodeToString(s[:]), hex.EncodeToString(got[:]),
		"fingerprint.key no longer holds the secret the journal's keyed records were made with")
}

// asOtherUser makes a journal of one record in a directory of another
// user's (nobody), its secret s left in fingerprint.key.tmp as a kill
// before keepSecret's rename leaves it, fingerprint.key missing; runChild
// runs TestSecretAdoptedDirSyncChild as that user and returns what it
// said.
func asOtherUser(t *testing.T) (dir string, s [32]byte, runChild func() string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs a child as another user")
	}
	if testing.Short() {
		t.Skip("runs a child")
	}
	const uid, gid = 65534, 65534
	base, err := os.MkdirTemp("", "ht1-secret-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o755))
	// The test binary, where the other user can run it.
	bin := filepath.Join(base, "filejournal.test")
	src, err := os.Open(os.Args[0])
	require.NoError(t, err)
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	require.NoError(t, src.Close())

	dir = filepath.Join(base, "j")
	j, s, ok := openSecret(t, dir)
	require.True(t, ok)
	reserve(t, j, entry("pay:keyed"))
	require.NoError(t, j.Close())
	require.NoError(t, os.Rename(filepath.Join(dir, secretName), filepath.Join(dir, secretTmpName)))
	for _, p := range []string{dir, filepath.Join(dir, journalName), filepath.Join(dir, lockName), filepath.Join(dir, secretTmpName)} {
		require.NoError(t, os.Chown(p, uid, gid))
	}
	return dir, s, func() string {
		cmd := childtest.Command("TestSecretAdoptedDirSyncChild", envDir+"="+dir)
		cmd.Path, cmd.Args[0] = bin, bin
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		out, err := cmd.CombinedOutput()
		t.Logf("child: %s", out)
		require.NoError(t, err)
		require.Contains(t, string(out), "opened ")
		return string(out)
	}
}

// TestSecretAdoptedDirSyncChild is the child of
// TestSecretAdoptedDirSyncFailsKeepsSecret: it opens the journal and
// says what Open found.
func TestSecretAdoptedDirSyncChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("a child of TestSecretAdoptedDirSyncFailsKeepsSecret")
	}
	dir := os.Getenv(envDir)
	j, err := Open(dir)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	s, ok := j.FingerprintSecret(j)
	r := j.Recovery()
	fmt.Printf("opened %x %v made %v err %v\n", s, ok, r.FingerprintSecretMade, r.FingerprintSecretErr)
	_ = j.Close()
}
