package journal

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"
)

const (
	// MaxActionID is the longest action id, in bytes, that every journal
	// stores.
	MaxActionID = 1024
	// MaxKeyLength is the longest key, in characters, that every journal
	// stores (Stripe's limit).
	MaxKeyLength = 255
	// MaxAttempts is the most Attempts a record holds (a PostgreSQL
	// integer's). The Transport counts no further: an action sent more
	// often is recorded with MaxAttempts.
	MaxAttempts = math.MaxInt32
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

// KeyForm is the form a record's key goes out in, as the value of the
// Idempotency-Key header: the key itself (bare, Stripe's form) or the key
// in double quotes (the IETF draft's Structured Field string). Servers
// take the two for two keys (Fiber refuses the quoted form), so a key is
// sent in one form for good: the one it was first sent in, which its
// record keeps.
type KeyForm uint8

const (
	// KeyFormUnrecorded: the record does not say (written before forms
	// were recorded, or by a journal that does not keep them). The
	// Transport sends such a key in the form its own WithQuotedKey says,
	// as releases before forms were recorded did.
	KeyFormUnrecorded KeyForm = 0
	// KeyFormBare: the key as it is.
	KeyFormBare KeyForm = 1
	// KeyFormQuoted: the key in double quotes.
	KeyFormQuoted KeyForm = 2
)

// String returns "unrecorded", "bare" or "quoted".
func (f KeyForm) String() string {
	switch f {
	case KeyFormUnrecorded:
		return "unrecorded"
	case KeyFormBare:
		return "bare"
	case KeyFormQuoted:
		return "quoted"
	}
	return fmt.Sprintf("KeyForm(%d)", uint8(f))
}

// MinCreatedAtUnixMilli and MaxCreatedAtUnixMilli bound a record's
// CreatedAt, in Unix milliseconds (see CheckRecord): from 1677-09-21
// 00:12:43.146 to 2262-04-11 23:47:16.854 UTC, the times whose Unix
// nanoseconds fit in an int64, to the millisecond.
const (
	MinCreatedAtUnixMilli = math.MinInt64 / int64(time.Millisecond)
	MaxCreatedAtUnixMilli = math.MaxInt64 / int64(time.Millisecond)
)

var (
	minCreatedAt = time.UnixMilli(MinCreatedAtUnixMilli)
	maxCreatedAt = time.UnixMilli(MaxCreatedAtUnixMilli)
)

// CheckRecord returns an error wrapping ErrInvalidRecord if a journal must
// refuse rec: an empty action id or one over MaxActionID bytes, a key that
// ValidKey refuses, a KeyForm other than the three KeyForms, a quoted key
// holding a '"' or a '\' (which the quoted form cannot hold unescaped), a
// CreatedAt outside MinCreatedAtUnixMilli to MaxCreatedAtUnixMilli (1677 to
// 2262), a state other than the three States, a negative Attempts or
// Status, or one over MaxAttempts. The difference of any two creation
// times in bounds fits in an int64 of milliseconds, so that no journal's
// expiry and no key window overflows.
//
// Every journal checks what it stores with it, and what it reads back: a
// stored record it refuses is reported as ErrCorruptRecord (see
// CheckStored), never returned.
func CheckRecord(rec Record) error {
	switch {
	case rec.ActionID == "" || len(rec.ActionID) > MaxActionID:
		return fmt.Errorf("%w: action id of %d bytes (1-%d allowed)", ErrInvalidRecord, len(rec.ActionID), MaxActionID)
	case !ValidKey(rec.Key):
		return fmt.Errorf("%w: key must be 1-%d visible ASCII characters", ErrInvalidRecord, MaxKeyLength)
	case rec.KeyForm > KeyFormQuoted:
		return fmt.Errorf("%w: key form %d", ErrInvalidRecord, rec.KeyForm)
	case rec.KeyForm == KeyFormQuoted && strings.ContainsAny(rec.Key, `"\`):
		return fmt.Errorf("%w: a quoted key with a '\"' or '\\' (the quoted form would need an escape)", ErrInvalidRecord)
	case rec.CreatedAt.Before(minCreatedAt) || rec.CreatedAt.After(maxCreatedAt):
		return fmt.Errorf("%w: created at %v, outside %v to %v", ErrInvalidRecord, rec.CreatedAt.UTC(), minCreatedAt.UTC(), maxCreatedAt.UTC())
	}
	return CheckProgress(rec)
}

// CheckProgress is CheckRecord for what Update stores: State, Attempts and
// Status.
func CheckProgress(rec Record) error {
	switch {
	case rec.State < StatePending || rec.State > StateUnknown:
		return fmt.Errorf("%w: state %d", ErrInvalidRecord, rec.State)
	case rec.Attempts < 0 || rec.Attempts > MaxAttempts:
		return fmt.Errorf("%w: attempts %d", ErrInvalidRecord, rec.Attempts)
	case rec.Status < 0 || rec.Status > math.MaxInt32:
		return fmt.Errorf("%w: status %d", ErrInvalidRecord, rec.Status)
	}
	return nil
}

// CheckStored is CheckRecord for a record a journal read back from its
// storage: nil if CheckRecord accepts rec, else an error wrapping
// ErrCorruptRecord (and not ErrInvalidRecord: the caller passed nothing
// wrong) that names the action and what is wrong. A journal returns it
// instead of the record.
func CheckStored(rec Record) error {
	if err := CheckRecord(rec); err != nil {
		return &corruptError{id: rec.ActionID, err: err}
	}
	return nil
}

// corruptError is a stored record that CheckRecord refuses: it says why,
// and matches ErrCorruptRecord alone.
type corruptError struct {
	id  string
	err error // CheckRecord's
}

func (e *corruptError) Error() string {
	why := strings.TrimPrefix(strings.TrimPrefix(e.err.Error(), ErrInvalidRecord.Error()), ": ")
	return fmt.Sprintf("%v: action %q: %s", ErrCorruptRecord, e.id, why)
}

func (e *corruptError) Is(target error) bool { return target == ErrCorruptRecord }

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
