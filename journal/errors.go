package journal

import (
	"errors"
	"fmt"
	"strings"
)

// Errors that journals return, wrapped; test them with errors.Is.
var (
	// ErrClosed: the journal was closed, or failed and must be reopened.
	ErrClosed = errors.New("idemretry: journal closed")
	// ErrNotFound: the journal holds no record of the action (or none with
	// the key given to Update).
	ErrNotFound = errors.New("idemretry: action not found in journal")
	// ErrUnavailable: the journal's storage did not answer (a database down,
	// unreachable or too slow for the context's deadline) or could not write
	// (a full disk). Nothing was sent when Reserve fails with it; the action
	// may be retried later.
	ErrUnavailable = errors.New("idemretry: journal unavailable")
	// ErrInvalidRecord: a record cannot be stored: see CheckRecord.
	ErrInvalidRecord = errors.New("idemretry: invalid journal record")
	// ErrCorruptRecord: a record the journal holds is one CheckRecord
	// refuses (an empty key, attempts out of range, ...), or its storage
	// is damaged: written by something else, or damaged where it lies.
	// Nothing of the action is sent; the record is left as it is for a
	// person to see.
	ErrCorruptRecord = errors.New("idemretry: corrupt journal record")
	// ErrIncompatible: the journal's storage was written by an unknown
	// version of its format, or with other settings (hashed action ids or
	// not), or has a shape the journal cannot use.
	ErrIncompatible = errors.New("idemretry: journal incompatible")
)

// CorruptRecordsError is the error Journal.Unfinished returns, beside the
// records it lists, when some of the unfinished records its storage holds
// are corrupt (records CheckStored refuses): it names each one left out of
// the list, so that the caller can resume the others and report, repair or
// Forget these. errors.Is matches it with ErrCorruptRecord, and with
// anything one of Errs matches. Find it with errors.As.
type CorruptRecordsError struct {
	// IDs are the action ids of the corrupt records, each once, in the
	// form the journal's Forget accepts (the digest form, for a journal
	// that hashes ids).
	IDs []string
	// Errs says what is wrong with each, as far as the journal says:
	// Errs[i] is about IDs[i], and wraps ErrCorruptRecord. It may be
	// shorter than IDs, or nil; Reason fills the gaps.
	Errs []error
}

// maxNamed is how many corrupt records a CorruptRecordsError's message
// names; it counts the others.
const maxNamed = 3

// Error names the corrupt records (the first few, and how many more) and
// what is wrong with each.
func (e *CorruptRecordsError) Error() string {
	if e == nil || len(e.IDs) == 0 { // a journal's typed nil, or one that names nothing
		msg := ErrCorruptRecord.Error() + ": unfinished records left out, unnamed"
		if e != nil && len(e.Errs) > 0 && e.Errs[0] != nil {
			msg += ": " + strings.ReplaceAll(e.Errs[0].Error(), "idemretry: ", "")
		}
		return msg
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%v: %d unfinished record", ErrCorruptRecord, len(e.IDs))
	if len(e.IDs) != 1 {
		b.WriteByte('s')
	}
	b.WriteString(" left out of the list")
	for i := range min(len(e.IDs), maxNamed) {
		sep := ": "
		if i > 0 {
			sep = "; "
		}
		b.WriteString(sep)
		why := strings.TrimPrefix(strings.TrimPrefix(e.Reason(i).Error(), ErrCorruptRecord.Error()), ": ")
		b.WriteString(strings.ReplaceAll(why, "idemretry: ", "")) // the prefix once
	}
	if len(e.IDs) > maxNamed {
		fmt.Fprintf(&b, "; and %d more", len(e.IDs)-maxNamed)
	}
	return b.String()
}

// Is reports whether target is ErrCorruptRecord.
func (e *CorruptRecordsError) Is(target error) bool { return target == ErrCorruptRecord }

// Unwrap returns Errs.
func (e *CorruptRecordsError) Unwrap() []error {
	if e == nil {
		return nil
	}
	return e.Errs
}

// Reason returns what is wrong with the record of IDs[i]: Errs[i] if the
// journal gave one that wraps ErrCorruptRecord, else an error wrapping
// ErrCorruptRecord that names the action (ErrCorruptRecord itself for an i
// out of range). Its methods take a nil *CorruptRecordsError, which names
// no record.
func (e *CorruptRecordsError) Reason(i int) error {
	if e == nil || i < 0 || i >= len(e.IDs) {
		return ErrCorruptRecord
	}
	if i < len(e.Errs) && errors.Is(e.Errs[i], ErrCorruptRecord) {
		return e.Errs[i]
	}
	return fmt.Errorf("%w: action %q", ErrCorruptRecord, e.IDs[i])
}
