package sqljournal

import "errors"

// Errors of this package, returned wrapped; test them with errors.Is. The
// Journal also wraps idemretry's sentinels (see [Journal]).
var (
	// ErrMalformedRecord: a row holds values no Journal writes (a
	// fingerprint that is not 32 bytes, a state other than the three). It
	// was written by something else and is left as it is for a person to
	// see. Records a caller passes in are refused with
	// idemretry.ErrJournalInvalidRecord instead.
	ErrMalformedRecord = errors.New("sqljournal: malformed record")
	// ErrContended: Reserve found the action's record changing under it
	// (forgotten, or finished and replaced) on every one of its tries.
	ErrContended = errors.New("sqljournal: action record changed concurrently on every try")
)
