package sqljournal

import (
	"fmt"
	"math"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// DefaultTable is the table [Open] uses unless [WithTable] names another.
const DefaultTable = "idemretry_actions"

// Defaults of the key window and grace that [Journal.Expire] keeps done
// records for: [journal.DefaultKeyWindow] and [journal.DefaultGrace].
const (
	// DefaultKeyWindow is the key window the journal is told unless
	// [WithKeyWindow] says otherwise.
	//
	// Deprecated: use [journal.DefaultKeyWindow], the one definition.
	DefaultKeyWindow = journal.DefaultKeyWindow
	// DefaultGrace is how long a done record is kept beyond the key window
	// unless [WithGrace] says otherwise.
	//
	// Deprecated: use [journal.DefaultGrace], the one definition.
	DefaultGrace = journal.DefaultGrace
)

// An Option configures [Open]. Options apply in order; a later one overrides
// an earlier one. A nil Option is skipped. Bad values make Open fail with an
// error wrapping [ErrInvalidOption]; none is clamped or replaced.
type Option func(*config)

type config struct {
	table       string
	createTable bool
	keyWindow   time.Duration
	grace       time.Duration
	hashIDs     bool
	now         func() time.Time
}

func defaultConfig() config {
	return config{table: DefaultTable, createTable: true, keyWindow: journal.DefaultKeyWindow, grace: journal.DefaultGrace, now: time.Now}
}

// WithTable keeps records in the table name instead of [DefaultTable]. name
// is an SQL identifier, optionally qualified by a schema ("payments.keys"):
// each part is 1 to 48 ASCII letters, digits or underscores, not starting
// with a digit. It is quoted in SQL, so it is case-sensitive. Anything else
// makes [Open] fail with an error wrapping [ErrInvalidOption]; the name is
// never interpolated unchecked.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithoutCreateTable makes [Open] use an existing table instead of creating
// it, for databases where the application's role may not run DDL. Open
// still checks that the table fits (its columns, its unique key on
// action_id, its id mode), and writes nothing: a table made without Open
// carries no record of its id mode until a creating Open marks it, and is
// judged by its rows meanwhile, so an empty one accepts either mode. Mark a
// table made by hand yourself, with a line of its comment (see [Open]),
// for example:
//
//	COMMENT ON TABLE idemretry_actions IS 'idemretry.sqljournal.action_ids=plain';
//
// A table made by an earlier version lacks the columns added since (the
// lease columns, key_form), which a creating Open adds; without one, Open
// refuses it with journal.ErrIncompatible, naming what to run, until they
// are added (on PostgreSQL 10 and older, adding key_form rewrites the
// table under its lock):
//
//	ALTER TABLE idemretry_actions ADD COLUMN lease_holder text, ADD COLUMN lease_until timestamptz;
//	ALTER TABLE idemretry_actions ADD COLUMN key_form smallint NOT NULL DEFAULT 0;
func WithoutCreateTable() Option { return func(c *config) { c.createTable = false } }

// WithKeyWindow tells the journal the Transport's key window (default
// [journal.DefaultKeyWindow]): give it the value given to idemretry.WithKeyWindow.
// [Journal.Expire] keeps a done record for the key window plus the grace
// ([WithGrace]) after its key was minted, so that a done action sent again
// within its window reuses its key and gets the server's stored answer. An
// expired done action gets a new key, and a server that still remembered
// the old one would then perform it twice: a journal told a shorter window
// than the Transport's would allow that. It must be positive.
func WithKeyWindow(window time.Duration) Option { return func(c *config) { c.keyWindow = window } }

// WithGrace sets how long a done record is kept beyond the key window
// (default [journal.DefaultGrace]): a margin for the clocks of a fleet's machines
// (a record's creation time is read from the clock of the machine that
// reserved it, its age from the clock of the one that calls Expire) and
// for a server that keeps keys a little longer than it documents. It must
// not be negative.
func WithGrace(grace time.Duration) Option { return func(c *config) { c.grace = grace } }

// WithHashedIDs stores the SHA-256 digest of each action id (as
// "sha256:" and 64 hex digits, [journal.Digest]) instead of the id itself.
// It keeps readable ids out of the table, but it is no licence to put
// personal data in them: a guessable id is as guessable hashed. Records
// from [Journal.Unfinished] then carry the digest form as ActionID, which
// [Journal.Reserve], [Journal.Update] and [Journal.Forget] accept. Every
// process sharing a table must agree on this option: the table records the
// mode it was created with, and [Open] in the other mode fails with an
// error wrapping journal.ErrIncompatible.
func WithHashedIDs() Option { return func(c *config) { c.hashIDs = true } }

// WithHashedActionIDs is [WithHashedIDs].
//
// Deprecated: use [WithHashedIDs], the name filejournal's option has too.
func WithHashedActionIDs() Option { return WithHashedIDs() }

// WithClock sets the clock that [Journal.Expire] measures a record's age
// with (default time.Now). It is for tests; a nil clock is an invalid
// option.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithNow is [WithClock].
//
// Deprecated: use [WithClock], the name of every package's clock option.
func WithNow(now func() time.Time) Option { return WithClock(now) }

// validate checks the options' values, in the order of their fields.
func (c *config) validate() error {
	switch {
	case c.keyWindow <= 0:
		return fmt.Errorf("sqljournal: key window %v, want > 0: %w", c.keyWindow, ErrInvalidOption)
	case c.grace < 0:
		return fmt.Errorf("sqljournal: grace %v, want >= 0: %w", c.grace, ErrInvalidOption)
	case c.grace > maxRetention-c.keyWindow:
		return fmt.Errorf("sqljournal: key window %v plus grace %v is longer than %v: %w", c.keyWindow, c.grace, maxRetention, ErrInvalidOption)
	case c.now == nil:
		return fmt.Errorf("sqljournal: nil clock: %w", ErrInvalidOption)
	}
	return nil
}

// maxRetention is the longest time.Duration: what the key window and grace
// add up to at most.
const maxRetention = time.Duration(math.MaxInt64)

// retention is how long after its key was minted a done record is kept.
func (c *config) retention() time.Duration { return c.keyWindow + c.grace }
