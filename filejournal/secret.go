package filejournal

// The journal's fingerprint secret (journal.FingerprintKeeper): the file
// fingerprint.key beside the journal, made once, never rewritten.

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

	"github.com/idemretry/idemretry/internal/datasync"
)

const (
	secretName    = "fingerprint.key"
	secretTmpName = "fingerprint.key.tmp"
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
// keyed fingerprints could not be checked under another secret. Deleting
// it starts a new secret; such actions are then refused, nothing sent,
// until their key windows end.
func (j *Journal) FingerprintSecret() ([32]byte, bool) { return j.secret, j.hasSecret }

// loadSecret reads dir's fingerprint.key, or makes it.
func loadSecret(dir string) (secret [32]byte, err error) {
	path := filepath.Join(dir, secretName)
	b, err := os.ReadFile(path)
	if err == nil {
		return parseSecret(path, b)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return secret, err
	}
	if _, err := io.ReadFull(rand.Reader, secret[:]); err != nil {
		return secret, fmt.Errorf("draw the fingerprint secret: %w", err)
	}
	tmp := filepath.Join(dir, secretTmpName)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return secret, err
	}
	_, err = f.Write(encodeSecret(secret))
	if err == nil {
		err = datasync.File(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = renameDurable(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return secret, err
	}
	return secret, nil
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
