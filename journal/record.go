package journal

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
)

const (
	// MaxActionID is the longest action id, in bytes, that every journal
	// stores.
	MaxActionID = 1024
	// MaxKeyLength is the longest key, in characters, that every journal
	// stores (Stripe's limit).
	MaxKeyLength = 255
	// DigestPrefix starts the digest form of an action id ("sha256:" and 64
	// lowercase hex digits) that journals hashing their ids return from
	// Unfinished and accept everywhere in place of the id.
	DigestPrefix = "sha256:"
)

// ValidKey reports whether key can be stored: 1 to MaxKeyLength visible
// ASCII characters, which every UUID and every key a caller may set
// satisfy.
func ValidKey(key string) bool {
	if key == "" || len(key) > MaxKeyLength {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// CheckRecord returns an error wrapping ErrInvalidRecord if a journal must
// refuse rec: an empty action id or one over MaxActionID bytes, a key that
// ValidKey refuses, a state other than the three States, or a negative or
// out-of-range (over 2^31-1) Attempts or Status.
func CheckRecord(rec Record) error {
	switch {
	case rec.ActionID == "" || len(rec.ActionID) > MaxActionID:
		return fmt.Errorf("%w: action id of %d bytes (1-%d allowed)", ErrInvalidRecord, len(rec.ActionID), MaxActionID)
	case !ValidKey(rec.Key):
		return fmt.Errorf("%w: key must be 1-%d visible ASCII characters", ErrInvalidRecord, MaxKeyLength)
	}
	return CheckProgress(rec)
}

// CheckProgress is CheckRecord for what Update stores: State, Attempts and
// Status.
func CheckProgress(rec Record) error {
	switch {
	case rec.State < StatePending || rec.State > StateUnknown:
		return fmt.Errorf("%w: state %d", ErrInvalidRecord, rec.State)
	case rec.Attempts < 0 || rec.Attempts > math.MaxInt32:
		return fmt.Errorf("%w: attempts %d", ErrInvalidRecord, rec.Attempts)
	case rec.Status < 0 || rec.Status > math.MaxInt32:
		return fmt.Errorf("%w: status %d", ErrInvalidRecord, rec.Status)
	}
	return nil
}

// Digest returns the digest form of an action id: DigestPrefix and the hex
// SHA-256 of id. An id already in digest form is returned as it is, so that
// ids read back from Unfinished can be passed again; another id of that form
// would be a SHA-256 preimage, which nobody can make on purpose.
func Digest(id string) string {
	if IsDigest(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return DigestPrefix + hex.EncodeToString(sum[:])
}

// IsDigest reports whether id is in digest form.
func IsDigest(id string) bool {
	h, ok := strings.CutPrefix(id, DigestPrefix)
	if !ok || len(h) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
