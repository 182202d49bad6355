package journal

import (
	"context"
	"time"
)

// A Syncer is a Journal that can make the updates it has accepted durable on
// demand (Update may be lazy). The Transport calls Sync after recording the
// outcome of an action named by its request's fingerprint: lost, a
// deliberate repeat after a crash would reuse the old key and be answered
// with the old payment's replay. Sync must return by the context's deadline.
type Syncer interface {
	Sync(ctx context.Context) error
}

// A Timekeeper is a Journal that keeps a time that never goes backwards: the
// latest clock reading it has seen, persisted. The Transport judges key
// windows by it when the clock is behind it (set back) by no more than the
// grace it was given, so that a clock set back cannot make a key look
// younger than it is. Now must be cheap and safe for concurrent use.
type Timekeeper interface {
	Now() time.Time
}

// A Leaser is a Journal that can lease an action to one holder at a time,
// across every process that shares its storage, so that a fleet has one
// machine in flight per action. Without it, two machines resuming the same
// action both send it under its key, and the server answers the second
// "409: a request with this key is in progress" on every retry. The lease
// is for load, not for safety: the key already makes the server perform the
// action once. A Transport whose journal is no Leaser sends as it always
// has, and so does one whose Lease fails (the failure is logged).
//
// Lease takes holder's lease on actionID, or renews it, until ttl from now
// on the storage's clock, and returns held true. When another holder's lease
// has not ended, it changes nothing and returns held false and until, when
// that lease ends. Whether a lease has ended is judged by the storage's clock
// alone, never by a caller's: machines whose clocks disagree still agree on
// who holds a lease. until is on the caller's clock: the time left on the
// storage's clock, from the caller's time when the answer came (after taking
// or renewing, from when the call began, so that the holder never believes
// in more time than it has). A lease may be taken over by another holder
// once it has ended, and a lease holds for its action id whatever key the
// action's record has. actionID is the id as given to Reserve or as
// Unfinished returns it. Lease fails with an error wrapping ErrNotFound when
// the action has no record (a lease needs a record), ErrInvalidRecord when
// the id is one Reserve refuses, holder is one that ValidKey refuses, or ttl
// is under a millisecond, and ErrClosed after Close.
//
// Release ends holder's lease on actionID, if holder has it; releasing a
// lease that has ended, was taken over or was never taken is not an error.
// Both methods return by the context's deadline, as every other call does.
type Leaser interface {
	Lease(ctx context.Context, actionID, holder string, ttl time.Duration) (held bool, until time.Time, err error)
	Release(ctx context.Context, actionID, holder string) error
}

// A NonBlocker is a Journal whose calls never block: none waits for I/O,
// another process or a lock held across such a wait, so each returns
// promptly whatever its context (Memory is one). The Transport arms no timer
// to bound the calls of such a journal (WithJournalTimeout): a timeout could
// not cut one short.
//
// NeverBlocks reports whether the calls of j never block, where j is the
// journal the Transport was given: true only when j is the receiver itself.
// A type that embeds a NonBlocker and adds waits of its own (a wrapper that
// delays or stalls some calls) inherits the method but not the claim, since
// j is then the wrapper; a wrapper that never blocks either implements
// NeverBlocks itself. A journal that may block must not claim it: its calls
// would then be bounded by the caller's context alone.
type NonBlocker interface {
	NeverBlocks(j Journal) bool
}

// A Getter is a Journal that can read an action's record without creating
// one, which Reserve would do for an action it has no record of. Get
// returns the record of actionID (as given, or in the digest form
// Unfinished reports), or false if there is none (a done record the
// journal has let go of, past its retention, counts as none). The Transport
// reads through it where creating a record would bring back an action
// someone has forgotten (Resume, reconciling an outcome-unknown action);
// every journal of this module is one.
type Getter interface {
	Get(ctx context.Context, actionID string) (Record, bool, error)
}

// A FingerprintKeeper is a Journal that keeps a secret of its own for the
// Transport's keyed request fingerprints: those of a named action's body
// of 512 bytes or more, checked with a MAC under a key made from the secret
// (faster than the SHA-256 that every other fingerprint is). The secret must
// be random, the same for every process that opens the journal for as long
// as any record made with it lives, never part of a Record, and readable
// only by whoever may also write the journal: whoever has it can craft a
// second body that passes for a first under the same action. ok is false
// when the journal has none (its records then get SHA-256 fingerprints,
// and a keyed one it holds cannot be checked). FingerprintSecret must be
// cheap and safe for concurrent use. A journal that is no FingerprintKeeper
// gets SHA-256 fingerprints alone.
//
// FingerprintSecret(j) answers for j, the journal the Transport was given,
// as NeverBlocks does: ok only when j is the keeper itself. A wrapper that
// embeds a keeper but keeps its records elsewhere would otherwise lend
// them a secret that the processes sharing those records do not have (their
// resends refused as uncheckable); one that stores through the keeper it
// embeds implements FingerprintSecret itself, asking the keeper about
// itself.
type FingerprintKeeper interface {
	FingerprintSecret(j Journal) (secret [32]byte, ok bool)
}
