package journal

import "errors"

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
