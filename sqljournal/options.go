package sqljournal

import (
	"fmt"
	"time"

	"github.com/idemretry/idemretry"
)

// DefaultTable is the table [Open] uses unless [WithTable] names another.
const DefaultTable = "idemretry_actions"

// DefaultRetention is how long a done record is kept after its key was
// minted: the Transport's default key window plus a day of margin, so that
// a done action's key outlives the server's memory of it.
const DefaultRetention = idemretry.DefaultKeyWindow + 24*time.Hour

// An Option configures [Open]. Options apply in order; a later one overrides
// an earlier one. A nil Option is skipped.
type Option func(*config)

type config struct {
	table       string
	createTable bool
	retention   time.Duration
	hashIDs     bool
	now         func() time.Time
}

func defaultConfig() config {
	return config{table: DefaultTable, createTable: true, retention: DefaultRetention, now: time.Now}
}

// WithTable keeps records in the table name instead of [DefaultTable]. name
// is an SQL identifier, optionally qualified by a schema ("payments.keys"):
// each part is 1 to 48 ASCII letters, digits or underscores, not starting
// with a digit. It is quoted in SQL, so it is case-sensitive. Anything else
// makes [Open] fail with an error wrapping [idemretry.ErrInvalidOption]; the
// name is never interpolated unchecked.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithoutCreateTable makes [Open] use an existing table instead of creating
// it, for databases where the application's role may not run DDL. Open
// still checks that the table fits (its columns, its unique key on
// action_id, its id mode), and writes nothing: a table made without Open
// carries no record of its id mode until a creating Open marks it, and is
// judged by its rows meanwhile.
func WithoutCreateTable() Option { return func(c *config) { c.createTable = false } }

// WithRetention sets how long [Journal.Expire] keeps a done record after its
// key was minted (default [DefaultRetention]). It must be positive, and at
// least the Transport's key window: an expired done action that is sent
// again gets a new key, and a server that still remembers the old one would
// then perform it twice.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithHashedActionIDs stores the SHA-256 digest of each action id (as
// "sha256:" and 64 hex digits) instead of the id itself. It keeps readable
// ids out of the table, but it is no licence to put personal data in them: a
// guessable id is as guessable hashed. Records from [Journal.Unfinished]
// then carry the digest form as ActionID, which [Journal.Forget] accepts.
// Every process sharing a table must agree on this option: the table
// records the mode it was created with, and [Open] in the other mode fails
// with an error wrapping journal.ErrIncompatible.
func WithHashedActionIDs() Option { return func(c *config) { c.hashIDs = true } }

// WithNow sets the clock that [Journal.Expire] measures the retention with
// (default time.Now). It is for tests.
func WithNow(now func() time.Time) Option { return func(c *config) { c.now = now } }

func (c *config) validate() error {
	switch {
	case c.retention <= 0:
		return fmt.Errorf("sqljournal: retention %v, want > 0: %w", c.retention, idemretry.ErrInvalidOption)
	case c.now == nil:
		return fmt.Errorf("sqljournal: nil clock: %w", idemretry.ErrInvalidOption)
	}
	return nil
}
