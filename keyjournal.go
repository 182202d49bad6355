package idemretry

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/idemretry/idemretry/internal/journal"
)

// Journal is where a Transport keeps each action's Idempotency-Key, so that
// every attempt of the action, in any goroutine and after a restart, sends the
// same key. OpenJournal returns the file-backed Journal that NewClient and
// NewTransport use by default; NewMemoryJournal keeps keys for the life of
// the process only; the sqljournal module shares them between machines.
//
// Implementations must be safe for concurrent use. Their errors should wrap
// the package's sentinel errors (ErrJournalClosed, ErrActionNotFound, ...) so
// that callers can test them with errors.Is.
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
	// method makes earlier updates durable with it; the Transport calls it
	// where a lost update would matter. It returns an error wrapping
	// ErrActionNotFound, and changes nothing, if the action has no record or
	// its record has another key (it was replaced under ReusePending, or
	// forgotten and created again, since rec was read).
	Update(ctx context.Context, rec Record) error

	// Unfinished returns the actions whose state is StatePending or
	// StateUnknown, oldest first: what an application should resume or
	// reconcile at start-up. A journal that hashes action ids returns
	// them in a digest form ("sha256:" and the hex digest) that its
	// Reserve, Update and Forget accept in place of the original id: a
	// listed record can be resumed, updated or forgotten as returned.
	Unfinished(ctx context.Context) ([]Record, error)

	// Forget removes an action's record durably, once the application has
	// reconciled it. The next request for the action gets a new key.
	// Forgetting an action that has no record is not an error.
	Forget(ctx context.Context, actionID string) error

	// Close flushes pending updates and releases the journal. Calls after
	// Close fail with an error wrapping ErrJournalClosed.
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

// Fingerprint is the SHA-256 of a request's method, URL and body. It tells
// whether a retried request is the same payload as the first.
type Fingerprint [sha256.Size]byte

// Record is what a Journal keeps per action: what resuming needs, and never
// the request's body, headers or credentials.
type Record struct {
	// ActionID names the logical action. Action ids are stored as given (or
	// hashed, if the journal is opened so): they must not carry personal data.
	ActionID string
	// Key is the Idempotency-Key value in its bare form.
	Key string
	// Fingerprint of the action's first request.
	Fingerprint Fingerprint
	// CreatedAt is when the key was minted; the key window runs from it.
	CreatedAt time.Time
	State     State
	// Attempts counts the requests sent under Key so far (as far as recorded).
	Attempts int
	// Status is the final HTTP status when State is StateDone, else 0.
	Status int
}

// Errors that journals return, wrapped; test them with errors.Is.
var (
	// ErrJournalClosed: the journal was closed, or failed and must be reopened.
	ErrJournalClosed = errors.New("idemretry: journal closed")
	// ErrActionNotFound: the journal holds no record of the action.
	ErrActionNotFound = errors.New("idemretry: action not found in journal")
	// ErrJournalUnavailable: the journal's storage did not answer (a database
	// down, unreachable or too slow for the context's deadline). Nothing was
	// sent when Reserve fails with it; the action may be retried later.
	ErrJournalUnavailable = errors.New("idemretry: journal unavailable")
)

// Errors of the file journal (OpenJournal, FileJournal), wrapped; test them
// with errors.Is.
var (
	// ErrJournalLocked: another owner, in this process or another one,
	// holds the journal directory's lock. OpenJournal returns it at once,
	// or after the wait set with WithJournalLockWait. A process that dies
	// releases its lock, however it dies.
	ErrJournalLocked = journal.ErrLocked
	// ErrJournalCorrupt: acknowledged data or the file header is damaged.
	// The error is a *CorruptionError naming the file and offset. Nothing
	// was changed on disk. Reopen with WithJournalSalvage to skip the
	// damaged frames (their records are lost and reported), or move the
	// directory away to start afresh.
	ErrJournalCorrupt = journal.ErrCorrupt
	// ErrJournalIncompatible: the journal was written by an unknown major
	// version of the format, or with the other WithHashedActionIDs setting.
	ErrJournalIncompatible = journal.ErrIncompatible
	// ErrJournalInvalidRecord: a record cannot be stored: an empty action id
	// or one over MaxJournalActionID bytes, a key that is neither a UUID nor
	// 1-255 visible ASCII characters, a state other than the three States,
	// or a negative or out-of-range Attempts or Status.
	ErrJournalInvalidRecord = journal.ErrInvalidRecord
)

// CorruptionError describes damage found when opening a file journal: Path
// and Offset of the damaged range, its Length, the sequence numbers of the
// frames lost in it (FirstLostSeq, LastLostSeq; both 0 for a damaged file
// header) and a Reason. It matches ErrJournalCorrupt with errors.Is. It is
// returned by OpenJournal, and listed in JournalRecovery.Salvaged for
// ranges a salvage skipped.
type CorruptionError = journal.CorruptionError

// MaxJournalActionID is the longest action id, in bytes, that a FileJournal
// stores (hashed ids are always 32 bytes).
const MaxJournalActionID = journal.MaxIDLen
