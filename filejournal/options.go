package filejournal

import (
	"fmt"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// Defaults of the options. The key window's and the grace's are
// journal.DefaultKeyWindow and journal.DefaultGrace.
const (
	// DefaultKeyWindow is the key window a journal keeps done records for
	// unless told otherwise (WithKeyWindow).
	//
	// Deprecated: use journal.DefaultKeyWindow, the one definition.
	DefaultKeyWindow = journal.DefaultKeyWindow
	// DefaultGrace is how long a done record is kept beyond the key window
	// unless told otherwise (WithGrace).
	//
	// Deprecated: use journal.DefaultGrace, the one definition.
	DefaultGrace = journal.DefaultGrace
	// DefaultFlushInterval bounds how long an Update waits before it is
	// written and synced when no Reserve or Forget carries it sooner
	// (WithFlushInterval).
	DefaultFlushInterval = time.Second
)

// An Option configures Open. A nil Option is ignored.
type Option func(*config)

// config is what Open works with. The options set its first fields; Open
// validates them and derives retention and maxClockLead (see check); the
// rest are fixed, or set by tests.
type config struct {
	now        func() time.Time
	keyWindow  time.Duration
	grace      time.Duration
	lockWait   time.Duration
	hashed     bool
	salvage    bool
	flushEvery time.Duration

	// retention is how long after its creation a done record is kept:
	// keyWindow + grace. maxClockLead is how far ahead of the clock the
	// persisted clock mark is believed: grace. Tests set them directly.
	retention    time.Duration
	maxClockLead time.Duration
	// compactMin: no compaction below this file size. Above it, a
	// compaction runs when the file is more than twice its live records.
	compactMin int64
	// expiryEvery is how often the committer looks for expired records to
	// compact away.
	expiryEvery time.Duration
	// maxAside bounds the torn-tail and corrupt-file copies kept (of each).
	maxAside int
	// hooks are test seams.
	hooks *hooks
}

func defaultConfig() config {
	return config{
		now:        time.Now,
		keyWindow:  journal.DefaultKeyWindow,
		grace:      journal.DefaultGrace,
		flushEvery: DefaultFlushInterval,

		compactMin:  1 << 20,
		expiryEvery: time.Hour,
		maxAside:    3,
	}
}

// check validates what the options set and derives retention and
// maxClockLead from the key window and the grace.
func (c *config) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
	switch {
	case c.now == nil:
		return bad("nil clock")
	case c.keyWindow <= 0:
		return bad("key window %v, want > 0", c.keyWindow)
	case c.grace < 0:
		return bad("grace %v, want >= 0", c.grace)
	case c.lockWait < 0:
		return bad("lock wait %v, want >= 0", c.lockWait)
	case c.flushEvery <= 0:
		return bad("flush interval %v, want > 0", c.flushEvery)
	}
	c.retention = c.keyWindow + c.grace
	if c.retention < c.keyWindow { // overflow: keep them "forever"
		c.retention = 1<<63 - 1
	}
	c.maxClockLead = c.grace
	return nil
}

// WithClock sets the clock the journal judges expiry by (default time.Now);
// the Transport passes its own (idemretry.WithClock). By the clock, expiry
// uses the latest time the journal has seen (from the clock, and from the
// records it loaded), so a clock set back neither resurrects an expired
// record nor keeps one longer; unless that time is more than the grace
// ahead of the clock (see WithGrace), which means the clock ran ahead and
// was corrected, and expiring by it would drop done records early. A done
// record also expires only once the journal has itself seen its retention
// pass (see WithKeyWindow), read from the clock's monotonic readings (those
// of time.Now), which no setting of the wall clock moves; a clock without
// them (a test's fake) is believed when it moves forward. A nil now is an
// invalid option.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// WithKeyWindow tells the journal the key window of the Transport that uses
// it (default journal.DefaultKeyWindow; the Transport passes its own,
// idemretry.WithKeyWindow): a journal.StateDone record is kept for the
// window plus the grace (WithGrace) after its creation, so that a repeat of
// the action within its window never gets a new key.
//
// A done record expires only when that retention is over by the clock AND
// the journal has itself seen that much time pass since the record was
// created, counted while it was open (on the monotonic clock, persisted
// across restarts). A record whose outcome may exist never vanishes because
// of a clock: one made while the clock was days behind, then corrected, is
// still there ten minutes later, and the Transport refuses the action
// (idemretry.ErrKeyWindowExpired) instead of sending it under a new key. The
// cost: time while no journal is open is not counted, so an application
// that is rarely open keeps its done records longer (about 77 bytes on disk
// and 140 in memory each) until it has been open for the retention in all.
// After that, Reserve treats the record as absent and compaction drops it.
// journal.StatePending and journal.StateUnknown records never expire: they
// are kept until Journal.Forget, because dropping one would let a new key
// be minted for an action whose outcome is unknown. A window of zero or
// less is an invalid option.
func WithKeyWindow(window time.Duration) Option {
	return func(c *config) { c.keyWindow = window }
}

// WithGrace sets the one bound the journal puts on clocks (default
// journal.DefaultGrace): done records are kept that long beyond the key window, and
// the clock mark the journal persists (the latest time it has seen) is
// believed when it is up to that far ahead of the clock, so that a clock
// set back by up to the grace can neither bring an expired record back nor
// keep one longer; a mark further ahead was left by a clock that ran ahead
// and was corrected, and is not believed. Expiring up to the grace early
// by a believed mark still keeps every done record for its whole window. A
// negative grace is an invalid option.
func WithGrace(grace time.Duration) Option {
	return func(c *config) { c.grace = grace }
}

// WithLockWait makes Open wait up to d for another owner to release the
// journal's lock before failing with ErrLocked (default 0: fail at once). A
// negative d is an invalid option. A Transport that opens its own journal
// takes it through idemretry.WithJournalDir(dir, filejournal.WithLockWait(d)).
func WithLockWait(d time.Duration) Option {
	return func(c *config) { c.lockWait = d }
}

// WithHashedIDs stores the SHA-256 of each action id instead of the id.
// Action ids must not carry personal data in any case; this option keeps
// even opaque ids (order numbers, say) off the disk. With it,
// Journal.Unfinished cannot return the original ids: it returns the digest
// form (journal.Digest: "sha256:" and the hex digest), which Journal.Reserve,
// Update and Forget accept in place of the original id: they reach the same
// record. A journal keeps the setting it was created with: opening it with
// the other setting fails with journal.ErrIncompatible.
func WithHashedIDs() Option {
	return func(c *config) { c.hashed = true }
}

// WithSalvage opens a journal whose acknowledged frames are damaged by
// skipping them, instead of failing with a *CorruptionError. The records in
// the skipped frames are lost: Journal.Recovery lists the damaged ranges
// and the actions they name, the damaged file is copied aside
// (journal.corrupt.*), and the journal is rewritten without them. Until
// the Journal is closed, its Unfinished names those actions beside the
// records it lists (so idemretry's Transport.Resume gives each a result),
// and refuses to make them anew, until each is forgotten. That refusal
// lives in memory only, and names an action as its damaged bytes read: an
// action whose id was damaged too is named in the damaged form, and its
// own id is not refused; after Close (or once the process ends) nothing
// is, and a new request of a lost action gets a new key, though its old
// one may have been charged.
// So use it only after deciding the loss is acceptable (for example after
// reconciling with the server the actions Recovery names); a damaged file
// header cannot be salvaged.
func WithSalvage() Option {
	return func(c *config) { c.salvage = true }
}

// WithFlushInterval sets how long an Update may wait before it is written
// (default DefaultFlushInterval). Reserve and Forget write at once, and
// carry any waiting updates with them. Zero or less is an invalid option.
func WithFlushInterval(d time.Duration) Option {
	return func(c *config) { c.flushEvery = d }
}
