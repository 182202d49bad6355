package idemretry

import (
	"time"

	engine "github.com/idemretry/idemretry/internal/journal"
)

// Defaults of the file journal's options.
const (
	// DefaultJournalGrace is how long a done record is kept beyond the key
	// window, so that a clock that drifted or a server that keeps keys a
	// little longer cannot make the journal forget a key the server still
	// holds.
	DefaultJournalGrace = 24 * time.Hour
	// DefaultJournalRetention is how long after its creation a done record
	// is kept: DefaultKeyWindow plus DefaultJournalGrace.
	DefaultJournalRetention = DefaultKeyWindow + DefaultJournalGrace
	// DefaultJournalFlushInterval bounds how long an Update waits before it
	// is written and synced when no Reserve or Forget carries it sooner.
	DefaultJournalFlushInterval = time.Second
)

// A JournalOption configures OpenJournal.
type JournalOption func(*journalConfig)

type journalConfig struct {
	now        func() time.Time
	retention  time.Duration
	lockWait   time.Duration
	hashed     bool
	salvage    bool
	flushEvery time.Duration
	// Test seams.
	hooks      *engine.Hooks
	compactMin int64
}

func defaultJournalConfig() journalConfig {
	return journalConfig{
		now:        time.Now,
		retention:  DefaultJournalRetention,
		flushEvery: DefaultJournalFlushInterval,
	}
}

// WithJournalClock sets the clock the journal judges expiry by (default
// time.Now). A done record expires only when its retention is over both by
// this clock and by the time the journal has itself seen pass since the
// record's creation while it was open (see WithJournalRetention). By the
// clock, expiry uses the latest time the journal has seen (from the clock,
// and from the records it loaded), so a clock set back neither resurrects
// an expired record nor keeps one longer; unless that time is more than
// DefaultJournalGrace ahead of the clock, which means the clock ran ahead
// and was corrected, and expiring by it would drop done records early. The
// time seen to pass is read from the clock's monotonic readings (those of
// time.Now), which no setting of the wall clock moves; a clock without them
// (a test's fake) is believed when it moves forward. A nil now restores
// time.Now.
func WithJournalClock(now func() time.Time) JournalOption {
	return func(c *journalConfig) {
		if now == nil {
			now = time.Now
		}
		c.now = now
	}
}

// WithJournalRetention sets how long after its creation a journal.StateDone record
// is kept (default DefaultJournalRetention). Keep it at least as long as the
// Transport's key window (WithKeyWindow) plus DefaultJournalGrace: the
// journal believes its persisted clock mark, when the clock is behind it, by
// up to the part of the retention beyond DefaultKeyWindow, so that a clock
// set back cannot keep records longer, while never expiring one early.
//
// A done record expires only when the retention is over by the clock AND
// the journal has itself seen that much time pass since the record was
// created, counted while it was open (on the monotonic clock, persisted
// across restarts). A record whose outcome may exist never vanishes
// because of a clock: one made while the clock was days behind, then
// corrected, is still there ten minutes later, and the Transport refuses
// the action (ErrKeyWindowExpired) instead of sending it under a new key.
// The cost: time while no journal is open is not counted, so an application
// that is rarely open keeps its done records longer (about 77 bytes on disk
// and 140 in memory each) until it has been open for the retention in all.
// After that, Reserve treats the record as absent and compaction drops it.
// journal.StatePending and journal.StateUnknown records never expire: they are kept until
// FileJournal.Forget, because dropping one would let a new key be minted for
// an action whose outcome is unknown. A value of zero or less restores the
// default.
func WithJournalRetention(d time.Duration) JournalOption {
	return func(c *journalConfig) {
		if d <= 0 {
			d = DefaultJournalRetention
		}
		c.retention = d
	}
}

// WithJournalLockWait makes OpenJournal wait up to d for another owner to
// release the journal's lock before failing with ErrJournalLocked (default
// 0: fail at once).
func WithJournalLockWait(d time.Duration) JournalOption {
	return func(c *journalConfig) { c.lockWait = max(d, 0) }
}

// WithHashedActionIDs stores the SHA-256 of each action id instead of the id.
// Action ids must not carry personal data in any case; this option keeps
// even opaque ids (order numbers, say) off the disk. With it,
// FileJournal.Unfinished cannot return the original ids: it returns
// "sha256:" followed by the hex digest, which FileJournal.Reserve, Update
// and Forget accept in place of the original id: they reach the same record.
// A journal keeps the setting it was created with: opening it with the other
// setting fails with journal.ErrIncompatible.
func WithHashedActionIDs() JournalOption {
	return func(c *journalConfig) { c.hashed = true }
}

// WithJournalSalvage opens a journal whose acknowledged frames are damaged
// by skipping them, instead of failing with a *CorruptionError. The records
// in the skipped frames are lost: FileJournal.Recovery lists the damaged
// ranges, the damaged file is copied aside (engine.corrupt.*), and the
// journal is rewritten without them. Use it only after deciding the loss is
// acceptable (for example after reconciling with the server); a damaged file
// header cannot be salvaged.
func WithJournalSalvage() JournalOption {
	return func(c *journalConfig) { c.salvage = true }
}

// WithJournalFlushInterval sets how long an Update may wait before it is
// written (default DefaultJournalFlushInterval). Reserve and Forget write
// at once, and carry any waiting updates with them.
func WithJournalFlushInterval(d time.Duration) JournalOption {
	return func(c *journalConfig) {
		if d <= 0 {
			d = DefaultJournalFlushInterval
		}
		c.flushEvery = d
	}
}

// withJournalHooks installs failpoints and file wrappers, for tests.
func withJournalHooks(h *engine.Hooks) JournalOption {
	return func(c *journalConfig) { c.hooks = h }
}

// withJournalCompactMin lowers the file size below which no compaction
// runs, for tests.
func withJournalCompactMin(n int64) JournalOption {
	return func(c *journalConfig) { c.compactMin = n }
}
