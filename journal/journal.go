// Package journal is the seam between idemretry's Transport and the stores
// that keep each action's Idempotency-Key, as database/sql/driver is to
// database/sql: the Journal interface a store implements, the Record it
// keeps, the sentinel errors it returns, the rules every store applies to
// keys and ids, the optional capabilities the Transport looks for (Syncer,
// Timekeeper, Leaser, NonBlocker, Getter), an in-memory Journal, and, in package
// journaltest, the conformance suite any Journal runs in one line. It
// imports nothing else of the module.
package journal

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"
)

// Journal is where a Transport keeps each action's Idempotency-Key, so that
// every attempt of the action, in any goroutine and after a restart, sends the
// same key. The filejournal package holds the file-backed Journal that
// idemretry uses by default; NewMemory keeps keys for the life of the
// process only; the sqljournal module shares them between machines.
//
// Implementations must be safe for concurrent use, must pass the
// conformance suite in package journaltest, and wrap this package's
// sentinel errors (ErrClosed, ErrNotFound, ...) so that callers can test
// them with errors.Is. They must store CreatedAt to the millisecond at
// least (a record read back may be truncated to whole milliseconds), or an
// earlier time, never a later one (sqljournal stores the earlier of the
// given time and the database's clock: see journaltest.EarlierCreatedAt),
// action ids of 1 to MaxActionID bytes, and any key that ValidKey accepts,
// with its KeyForm.
// They refuse to store a record that CheckRecord refuses
// (ErrInvalidRecord), and never return one: a stored record it refuses
// (damaged, or written by something else) is reported with an error
// wrapping ErrCorruptRecord (see CheckStored; Unfinished names such
// records with a CorruptRecordsError and lists the others).
type Journal interface {
	// Reserve returns the record of rec.ActionID, creating it from rec when
	// there is none, or when mode is ReusePending and the existing record is
	// StateDone. created reports which. A record it creates is durable when
	// Reserve returns: it survives a crash of the process (and, for journals
	// that promise it, of the machine). Concurrent Reserves of one action
	// return the same key.
	Reserve(ctx context.Context, rec Record, mode ReserveMode) (got Record, created bool, err error)

	// Update stores the State, Attempts and Status of an existing action with
	// the same key: the record of rec.ActionID whose Key is rec.Key. Done is
	// final: a record in StateDone keeps its State and Status whatever later
	// updates say (a stale writer must not undo a recorded outcome); Update
	// may then change Attempts only, and returns nil or an error. It may
	// return before the change is durable: losing an update costs one resend
	// with the same key. A journal that offers a Sync(context.Context) error
	// method (a Syncer) makes earlier updates durable with it; the
	// Transport calls it where a lost update would matter. It returns an error wrapping
	// ErrNotFound, and changes nothing, if the action has no record or
	// its record has another key (it was replaced under ReusePending, or
	// forgotten and created again, since rec was read).
	Update(ctx context.Context, rec Record) error

	// Unfinished returns the actions whose state is StatePending or
	// StateUnknown, oldest first: what an application should resume or
	// reconcile at start-up. A journal that hashes action ids returns
	// them in a digest form ("sha256:" and the hex digest) that its
	// Reserve, Update and Forget accept in place of the original id: a
	// listed record can be resumed, updated or forgotten as returned.
	//
	// A corrupt record (one CheckStored refuses) is never listed. When
	// some of the unfinished records in its storage are corrupt (a
	// record of a state no journal writes counts as unfinished: it may
	// have been pending),
	// Unfinished returns the intact ones with an error wrapping a
	// *CorruptRecordsError that names every one left out (it goes on
	// past the first), and nothing else: that error says the list is
	// complete but for them. A journal may instead return nil and an
	// error wrapping ErrCorruptRecord, as before CorruptRecordsError was
	// defined: that is correct too. With any other error, Unfinished
	// returns no records.
	//
	// So a caller that treats any error as a failure stays correct: it
	// resumes nothing and loses nothing (the journal keeps every record)
	// until the corrupt ones are repaired or forgotten. One that finds
	// the *CorruptRecordsError with errors.As resumes the records listed
	// and reports, repairs or Forgets the ones it names: idemretry's
	// Transport.Resume gives each a ResumeResult of its own.
	Unfinished(ctx context.Context) ([]Record, error)

	// Forget removes an action's record durably, once the application has
	// reconciled it. The next request for the action gets a new key.
	// Forgetting an action that has no record is not an error.
	Forget(ctx context.Context, actionID string) error

	// Close flushes pending updates and releases the journal. Calls after
	// Close fail with an error wrapping ErrClosed.
	Close() error
}

// ReserveMode says which existing record Journal.Reserve returns.
type ReserveMode uint8

const (
	// ReuseAny returns an existing record whatever its state: an explicit
	// action id keeps its key for the whole key window, even after the action
	// completed (the server then replays its stored answer).
	ReuseAny ReserveMode = iota
	// ReusePending returns an existing record only while it is not done; a
	// done record is replaced by a new one with a new key. It is for actions
	// identified by a request fingerprint, where a resend after a crash must
	// reuse the key but a deliberate repeat after completion is a new action.
	ReusePending
)

// State is where an action stands.
type State uint8

const (
	// StatePending: the key is reserved and no definitive answer has been
	// seen. The request may or may not have reached the server.
	StatePending State = 1
	// StateDone: a definitive answer (2xx, or a status that is not retried)
	// was received; Record.Status holds it.
	StateDone State = 2
	// StateUnknown: the key window ended with no definitive answer. The
	// server may have performed the action. It is never sent again under a
	// new key: the application must reconcile it (check the server) and then
	// call Journal.Forget.
	StateUnknown State = 3
)

// String returns "pending", "done" or "unknown".
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateDone:
		return "done"
	case StateUnknown:
		return "unknown"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Fingerprint tells whether a retried request is the same payload as the
// first: a SHA-256 of the request's method, URL and body, or, for a named
// action's body of 512 bytes or more, when the journal is a
// FingerprintKeeper, a MAC under
// a key made from the journal's secret (with a salt, which the Transport
// uses to compute a request's own in the same form). A Journal stores it as
// it is given and never compares it.
type Fingerprint [sha256.Size]byte

// Record is what a Journal keeps per action: what resuming needs, and never
// the request's body, headers or credentials.
type Record struct {
	// ActionID names the logical action. Action ids are stored as given (or
	// hashed, if the journal is opened so): they must not carry personal data.
	ActionID string
	// Key is the Idempotency-Key value in its bare form.
	Key string
	// KeyForm is the form Key was first sent in, which every later
	// attempt and resume of the action uses (see KeyForm). Reserve stores
	// it with the key, and a record replaced under ReusePending takes the
	// new one's; Update leaves it as it is.
	KeyForm KeyForm
	// Fingerprint of the action's first request.
	Fingerprint Fingerprint
	// CreatedAt is when the key was minted; the key window runs from it.
	CreatedAt time.Time
	State     State
	// Attempts counts the attempts made under Key (each request written,
	// and each that failed to connect), as far as recorded. The Transport
	// counts an action's first attempt when it reserves the key, durably,
	// before that attempt leaves, so a record it created says at least 1,
	// even if its process was killed during that attempt (or before it
	// left). Later attempts are recorded lazily (after the first one's
	// answer, and when the request ends): after a crash, more may have
	// been sent than it says. Updates never lower it.
	Attempts int
	// Status is the final HTTP status when State is StateDone, else 0.
	Status int
}
