package filejournal

// The journal's fingerprint secret (journal.FingerprintKeeper): the file
// fingerprint.key beside the journal, made once (and made again of the
// same secret if it is deleted while the Journal is open: keepSecret),
// never rewritten.

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/idemretry/idemretry/internal/datasync"
	"github.com/idemretry/idemretry/journal"
)

const (
	secretName = "fingerprint.key"
	// secretTmpName is where keepSecret writes the secret in use before
	// its rename, and the one temporary name Open takes (adoptSecretTmp).
	secretTmpName = "fingerprint.key.tmp"
	// secretNewTmpName is where Open writes a new secret before its
	// rename: never taken, since no record was made with it, and the
	// journal may hold records made under a deleted one, which the next
	// Open must report (Recovery.FingerprintSecretMade) when it makes its
	// own.
	secretNewTmpName = "fingerprint.key.new"
)

// secretMagic begins fingerprint.key, which is secretMagic, the 32-byte
// secret, and the CRC-32C (Castagnoli) of both, little-endian: 64 bytes.
var secretMagic = []byte("idemretry fingerprint key 1\n")

const secretFileSize = 28 + 32 + 4

// FingerprintSecret implements journal.FingerprintKeeper: the secret in
// the journal's fingerprint.key, which Open reads, or makes if the
// directory has none (from crypto/rand; written and synced under a
// temporary name, renamed into place, the directory synced). It is the
// same for every process that opens the directory, and readable by the
// journal's owner alone (mode 0600), as the journal is. ok is false when
// Open could not read or make it (Recovery.FingerprintSecretErr says why).
// A damaged fingerprint.key is never replaced: the actions recorded with
// keyed fingerprints could not be checked under another secret. Deleted
// while the Journal is open, it is made again of the same secret
// (keepSecret); deleted while it is closed, the next Open starts a new
// secret, and such actions are then refused, nothing sent, until their
// key windows end. It answers for other == this Journal only
// (see journal.FingerprintKeeper).
func (j *Journal) FingerprintSecret(other journal.Journal) ([32]byte, bool) {
	if o, ok := other.(*Journal); !ok || o != j || j == nil || !j.hasSecret {
		return [32]byte{}, false
	}
	return j.secret, true
}

// loadSecret reads dir's fingerprint.key, or makes it (made).
func loadSecret(dir string) (secret [32]byte, made bool, err error) {
	path := filepath.Join(dir, secretName)
	b, err := readSecret(path)
	if err == nil {
		if secret, err = parseSecret(path, b); err == nil {
			// A tmp beside a whole key is stale (a crash long ago, the key
			// restored since): kept, a later Open would take it for the
			// secret in use once the key was deleted. Removing it is
			// best effort: one that cannot be removed stays as it was.
			for _, name := range []string{secretTmpName, secretNewTmpName} {
				_ = os.Remove(filepath.Join(dir, name))
			}
		}
		return secret, false, err
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return secret, false, err
	}
	// Only when there is nothing under the name: a dangling symlink (its
	// target on a volume not mounted, say) is left, not replaced.
	if _, lerr := os.Lstat(path); !errors.Is(lerr, fs.ErrNotExist) {
		return secret, false, err
	}
	if s, ok, err := adoptSecretTmp(dir); ok || err != nil {
		return s, false, err
	}
	// keepSecret's tmp, not taken (partial, a symlink, of a wider mode):
	// removed, as writeSecret removes its own.
	if err := os.Remove(filepath.Join(dir, secretTmpName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return secret, false, err
	}
	if _, err := io.ReadFull(rand.Reader, secret[:]); err != nil {
		return secret, false, fmt.Errorf("draw the fingerprint secret: %w", err)
	}
	if err := writeSecret(dir, secretNewTmpName, secret, nil); err != nil {
		return secret, false, err
	}
	return secret, true, nil
}

// adoptSecretTmp renames a whole fingerprint.key.tmp into place, when
// fingerprint.key is missing, and returns its secret: a process killed
// after writeSecret synced it and before the rename (keepSecret making
// fingerprint.key again, of the secret in use) left the secret there, and
// the journal's keyed records were made with it. An Open making a new
// secret writes it under another name (secretNewTmpName), never taken:
// taken, a new secret would replace a deleted one with no
// Recovery.FingerprintSecretMade to say so. Only a
// regular file that is no symlink, of the owner's mode alone (as
// writeSecret makes it), with the right size, magic and checksum, is
// taken; anything else is removed by loadSecret. One of these that cannot
// be read (err: EACCES, EMFILE, EIO) is left as it is, as an unreadable
// fingerprint.key is: it may hold the secret in use.
func adoptSecretTmp(dir string) (secret [32]byte, ok bool, err error) {
	tmp := filepath.Join(dir, secretTmpName)
	fi, err := os.Lstat(tmp)
	if errors.Is(err, fs.ErrNotExist) {
		return secret, false, nil
	}
	if err != nil {
		return secret, false, err
	}
	// Windows reports every writable file as 0666: its mode tells nothing.
	if !fi.Mode().IsRegular() || (runtime.GOOS != "windows" && fi.Mode().Perm()&^0o600 != 0) || fi.Size() != secretFileSize {
		return secret, false, nil
	}
	b, err := readSecret(tmp)
	if err != nil {
		return secret, false, err
	}
	if secret, err = parseSecret(tmp, b); err != nil {
		return secret, false, nil // not a whole secret
	}
	if err := renameDurable(tmp, filepath.Join(dir, secretName)); err != nil {
		return secret, false, err
	}
	// From here on fingerprint.key holds the secret in use: never fall
	// through to making a new one (renamed over it) if the directory cannot
	// be synced. A power loss that undoes the rename leaves the tmp, taken
	// again by the next Open.
	_ = syncDir(dir)
	return secret, true, nil
}

// writeSecret makes dir's fingerprint.key of secret durably: written and
// synced under the temporary name tmpName, renamed into place, the
// directory synced. check, if not nil, is called just before the rename,
// which happens only if it returns nil.
func writeSecret(dir, tmpName string, secret [32]byte, check func() error) error {
	// A leftover tmp (a crash before the rename) is removed, not reused:
	// O_TRUNC would keep its mode, and follow it if it were a symlink.
	tmp := filepath.Join(dir, tmpName)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(encodeSecret(secret))
	if err == nil {
		err = datasync.File(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && check != nil {
		err = check()
	}
	if err == nil {
		secretTestHook("synced")
	}
	if err == nil {
		err = renameDurable(tmp, filepath.Join(dir, secretName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// secretTestHook is called by writeSecret once fingerprint.key.tmp is
// written and synced, before its rename; a test's child stops there to be
// killed.
var secretTestHook = func(step string) {}

// secretCheckEvery is how often, at most, a batch's commit looks for the
// journal's fingerprint.key (keepSecret).
const secretCheckEvery = time.Second

// keepSecret makes fingerprint.key again, of the secret this Journal
// holds, if nothing is left under its name: deleted while the Journal is
// open, the next Open would make a new secret, under which the keyed
// fingerprints recorded with this one could not be checked. The committer
// calls it after a batch, at most once per secretCheckEvery: a batch that
// comes sooner gets wait, the time until the check is due, and the
// committer checks then (force), so that the check comes within
// secretCheckEvery of the first batch after a deletion even if no batch
// follows; and at Close. A deletion thus costs the secret only to a
// process that ends (a crash, a kill) before that check: the keyed
// records it wrote since the last one. Nothing is written unless the
// directory still holds this Journal's journal file (present): moved
// away, or replaced by another directory, its secret must not be left in
// the one now at its path, which is not this journal's. A file of another
// content, or a dangling symlink, is left as Open leaves it. A failure is
// tried again at the next check, and returned (Close reports it). Only the
// committer calls it.
func (j *Journal) keepSecret(now time.Time, force bool) (wait time.Duration, err error) {
	if !j.hasSecret {
		return 0, nil
	}
	if since := now.Sub(j.secretChecked); !force && since < secretCheckEvery {
		return secretCheckEvery - since, nil
	}
	j.secretChecked = now
	if _, err := os.Lstat(filepath.Join(j.dir, secretName)); !errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if j.present() != nil {
		return 0, nil
	}
	if err := writeSecret(j.dir, secretTmpName, j.secret, j.present); err != nil {
		return 0, fmt.Errorf("%s deleted and not made again: %w", secretName, err)
	}
	return 0, nil
}

// readSecret reads fingerprint.key at path (through a symlink), at most
// one byte more than its size, and only if it is a regular file: a FIFO
// would block Open, a directory or device is no secret.
func readSecret(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &CorruptionError{Path: path, Reason: fmt.Sprintf("not a regular file (%v)", fi.Mode().Type())}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, secretFileSize+1))
}

func encodeSecret(secret [32]byte) []byte {
	b := make([]byte, 0, secretFileSize)
	b = append(b, secretMagic...)
	b = append(b, secret[:]...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseSecret checks and decodes fingerprint.key's bytes b.
func parseSecret(path string, b []byte) (secret [32]byte, err error) {
	n := len(secretMagic)
	switch {
	case len(b) != secretFileSize:
		return secret, &CorruptionError{Path: path, Reason: fmt.Sprintf("fingerprint secret of %d bytes, want %d", len(b), secretFileSize)}
	case !bytes.Equal(b[:n], secretMagic):
		return secret, &CorruptionError{Path: path, Reason: "not a fingerprint secret (bad magic)"}
	case crc32.Checksum(b[:n+32], castagnoli) != binary.LittleEndian.Uint32(b[n+32:]):
		return secret, &CorruptionError{Path: path, Offset: int64(n), Reason: "fingerprint secret checksum mismatch"}
	}
	copy(secret[:], b[n:n+32])
	return secret, nil
}
