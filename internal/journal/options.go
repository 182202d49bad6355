package journal

import (
	"errors"
	"time"
)

// Options configure Open. The zero value of each field picks its default.
type Options struct {
	// Now is the clock for created-at checks and expiry (default time.Now).
	Now func() time.Time
	// Retention is how long a StateDone record is kept after its creation
	// (required, > 0), by the clock and by the time the Store has seen pass
	// while open (see Store.expired). Pending and unknown records are kept
	// until forgotten.
	Retention time.Duration
	// MaxClockLead bounds how far the clock high-water mark may stand ahead
	// of the clock and still be believed for expiry (default 24h, the
	// transport's grace beyond the key window). A mark further ahead was set
	// by a clock that ran ahead and was corrected: trusting it would expire
	// done records early; within the lead, expiring up to that much early
	// is what the grace allows, and a clock set back that far cannot bring
	// expired records back.
	MaxClockLead time.Duration
	// LockWait is how long Open waits for another owner's lock (default 0:
	// fail at once with ErrLocked).
	LockWait time.Duration
	// HashedIDs records, in a new file's header, that ids are digests; an
	// existing file written with the other setting is refused.
	HashedIDs bool
	// Salvage opens a file with damaged acknowledged frames by skipping
	// them; the Report lists what was lost.
	Salvage bool
	// FlushInterval bounds how long a lazy update waits for a batch to
	// carry it (default 1s).
	FlushInterval time.Duration
	// CompactMinBytes: no compaction below this file size (default 1 MiB).
	// Above it, a compaction runs when the file is more than twice its live
	// records.
	CompactMinBytes int64
	// ExpiryInterval is how often the committer looks for expired records
	// to compact away (default 1h).
	ExpiryInterval time.Duration
	// MaxAsideCopies bounds the torn-tail and corrupt-file copies kept
	// (default 3 of each).
	MaxAsideCopies int
	// ErrClosed and ErrNotFound are the sentinels wrapped by errors for a
	// closed or failed store and for a missing action (defaults: this
	// package's own).
	ErrClosed, ErrNotFound error
	// Hooks are test seams.
	Hooks *Hooks
}

// Default sentinels, used when Options leaves them nil.
var (
	errClosedDefault   = errors.New("journal: closed")
	errNotFoundDefault = errors.New("journal: action not found")
)

func (o *Options) fill() error {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Retention <= 0 {
		return errors.New("journal: retention must be positive")
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = time.Second
	}
	if o.MaxClockLead <= 0 {
		o.MaxClockLead = 24 * time.Hour
	}
	if o.CompactMinBytes <= 0 {
		o.CompactMinBytes = 1 << 20
	}
	if o.ExpiryInterval <= 0 {
		o.ExpiryInterval = time.Hour
	}
	if o.MaxAsideCopies <= 0 {
		o.MaxAsideCopies = 3
	}
	if o.ErrClosed == nil {
		o.ErrClosed = errClosedDefault
	}
	if o.ErrNotFound == nil {
		o.ErrNotFound = errNotFoundDefault
	}
	return nil
}
