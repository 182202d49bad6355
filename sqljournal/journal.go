package sqljournal

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// Journal is a [journal.Journal] in a PostgreSQL table, shared by every
// process that opens the same table. It is safe for concurrent use; all its
// coordination happens in the database, so any number of Journals, in one
// process or on many machines, may use one table at once.
//
// Every method runs one or two statements on the caller's *sql.DB and holds
// no connection between calls. Size the pool for the requests in flight,
// and keep idle connections (db.SetMaxIdleConns) close to the open limit:
// database/sql keeps only two by default, and reconnecting costs more than
// a Reserve.
//
// Every call that takes a context returns by the context's end (at most
// 50 ms later, for the driver to report), even when the database hangs: a
// lock held by another session, a paused or partitioned server. pgx ends a
// statement as soon as its context does; with a driver that waits for the
// server to confirm a cancellation, the call returns anyway and the
// statement finishes in the background.
//
// Errors wrap [journal.ErrClosed] after [Journal.Close],
// [journal.ErrNotFound] from [Journal.Update], and
// [journal.ErrUnavailable] when the database did not answer: the
// context's deadline passed, the connection failed (refused, reset, closed,
// killed), or the server said it cannot serve now (SQLSTATE class 08, 53
// or 58; 57P01, 57P02, 57P03 or 57P05, shutting down or ending the session;
// 57014 or 55P03, a statement or lock timeout; 25006, a read-only standby).
// The driver's error and, when the context ended, the context's error are
// kept in the chain. A failed write may still have been committed (the
// answer was lost, as with any database call, or the statement went on
// after the call returned); the Transport sends nothing after a failed
// Reserve, the next Reserve returns the committed record, and a late
// Update cannot undo a done record.
type Journal struct {
	db     *sql.DB
	cfg    config
	q      queries
	closed atomic.Bool
	// clk is the latest reading of the database's clock. See Now.
	clk dbClock
}

// dbClock is a reading of the database's clock (base) and the local time,
// with its monotonic reading, just before it was asked for (at).
type dbClock struct {
	mu       sync.Mutex
	base, at time.Time
}

// maxClockRead is how long a read of the database's clock may take to be
// believed: the reading is at most that far ahead of the database's clock.
const maxClockRead = time.Second

// observe takes a reading of the database's clock (us, Unix microseconds)
// asked for at at, if it answered within maxClockRead and is ahead of the
// time the reading in use gives now: Now never goes backwards, and a
// machine that was suspended (its monotonic clock stood still meanwhile)
// catches up with the database at its next Reserve.
func (c *dbClock) observe(us int64, at time.Time) {
	n := time.Now()
	if n.Sub(at) > maxClockRead {
		return
	}
	base := time.UnixMicro(us)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || base.Add(n.Sub(at)).After(c.base.Add(n.Sub(c.at))) {
		c.base, c.at = base, at
	}
}

var (
	_ journal.Journal    = (*Journal)(nil)
	_ journal.Timekeeper = (*Journal)(nil)
)

// Now implements [journal.Timekeeper]: the database's clock, as Open or
// the latest Reserve read it, advanced by the time that has passed since on
// this machine's monotonic clock, which setting the machine's clock does
// not move. It never goes backwards, and is never behind the database's
// clock by more than the drift of the monotonic clock since that reading,
// or the time this machine was suspended since (the monotonic clock stands
// still then): each Reserve reads the database's clock again, before the
// Transport judges the record it returns (a reading starts ahead by up to
// its round trip, at most maxClockRead).
//
// A Transport judges key windows by it when the machine's clock is behind
// it (by up to a day): a machine whose clock runs behind the database's
// would otherwise take a key minted by another machine for younger than
// it is, and send it after its window, when the server may have forgotten
// it and would perform the action again. Together with Reserve's creation
// time (the earlier of the minter's clock and the database's), the
// database's clock is the one every machine's windows are held to, as it is
// for leases.
func (j *Journal) Now() time.Time {
	j.clk.mu.Lock()
	defer j.clk.mu.Unlock()
	return j.clk.base.Add(time.Since(j.clk.at))
}

// Open returns a Journal that keeps its records in db, creating the table
// (and two partial indexes) if it is missing, unless [WithoutCreateTable].
// The caller owns db: [Journal.Close] leaves it open, and its pool settings
// bound how many statements the Journal runs at once. The table is
//
//	action_id   text PRIMARY KEY  -- as given, or hashed (WithHashedIDs)
//	key         text              -- the Idempotency-Key, bare
//	fingerprint bytea             -- SHA-256 of the first request
//	created_at  bigint            -- when the key was minted, Unix milliseconds (by the database's clock if it was behind the minter's)
//	state       smallint          -- journal.State: 1 pending, 2 done, 3 unknown
//	attempts    integer
//	status      integer           -- final HTTP status when done, else 0
//	lease_holder text             -- who has the action's lease (Journal.Lease), or NULL
//	lease_until  timestamptz      -- when that lease ends, on the database's clock
//	key_form    smallint NOT NULL DEFAULT 0 -- journal.KeyForm the key was first sent in: 1 bare, 2 quoted, 0 unrecorded
//
// An Open that may create tables adds the two lease columns and key_form to
// a table made before them (by an earlier version, or by hand). A row
// written without key_form (before it, or by an earlier version sharing the
// table) reads unrecorded: its key is sent in the form the Transport's
// WithQuotedKey says, as an earlier version sends every key. So while
// machines of an earlier version share the table, they send a key that a
// caller set in the other form (or one recorded under the other
// WithQuotedKey setting) in their own form: upgrade them all before relying
// on the recorded forms.
//
// The table records whether its action ids are hashed
// ([WithHashedIDs]) in its comment, "idemretry.sqljournal.action_ids=plain"
// or "...=sha256", written by the Open that creates it, or, for a table
// made without Open (by hand, or by an earlier version), by the first Open
// without [WithoutCreateTable], which adds that line to a comment the table
// already has and keeps the comment's text.
//
// Open fails with an error wrapping [ErrInvalidOption] for a nil db or a
// bad option value (a nil option is skipped); [journal.ErrIncompatible] when
// the table does not fit: a column missing (the lease columns and key_form
// included, on a table opened [WithoutCreateTable], with the ALTER TABLE
// that adds them) or of another type, no unique
// index or primary key on action_id alone (Reserve's INSERT ... ON CONFLICT
// (action_id) needs one; a deferrable one does not do), or action ids
// recorded in the other mode than this journal's (two processes in
// different modes would give one action two keys; a table without the
// record is judged by a sample of its rows: any id not in digest form means
// plain, digests only mean hashed); [journal.ErrUnavailable] when
// the database does not answer (see [Journal]); else the database's error.
func Open(ctx context.Context, db *sql.DB, opts ...Option) (*Journal, error) {
	if db == nil {
		return nil, fmt.Errorf("sqljournal: nil *sql.DB: %w", ErrInvalidOption)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil { // as NewTransport: a nil option is no option
			o(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := parseTable(cfg.table)
	if err != nil {
		return nil, err
	}
	q := newQueries(t)
	if cfg.createTable {
		if _, err := bounded(ctx, func() (struct{}, error) { return struct{}{}, createSchema(ctx, db, t, cfg.idMode()) }); err != nil {
			return nil, dbError(ctx, "create table "+t.quoted, incompatible(err))
		}
	}
	_, err = bounded(ctx, func() (struct{}, error) {
		if err := checkSchema(ctx, db, t, q); err != nil {
			return struct{}{}, err
		}
		if err := checkMode(ctx, db, t, cfg.idMode()); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, checkLeaseSchema(ctx, db, t, q)
	})
	if err != nil {
		return nil, dbError(ctx, "table "+t.quoted, err)
	}
	j := &Journal{db: db, cfg: cfg, q: q}
	at := time.Now()
	us, err := bounded(ctx, func() (us int64, err error) {
		return us, db.QueryRowContext(ctx, `SELECT `+dbClockUs).Scan(&us)
	})
	if err != nil {
		return nil, dbError(ctx, "read the database's clock", err)
	}
	// Believed however long it took: the first reading (later ones, only
	// if they answer within maxClockRead and are ahead of it).
	j.clk.base, j.clk.at = time.UnixMicro(us), at
	return j, nil
}

// Close marks the Journal closed: later calls fail with an error wrapping
// [journal.ErrClosed]. There is nothing to flush, since every
// method has finished its statement when it returns, and db stays open for
// its owner. Close is safe to call more than once and always returns nil.
func (j *Journal) Close() error {
	j.closed.Store(true)
	return nil
}

// usable returns why a call cannot run, if it cannot.
func (j *Journal) usable(ctx context.Context, op string) error {
	if j.closed.Load() {
		return fmt.Errorf("sqljournal: %s: %w", op, journal.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqljournal: %s: %w", op, err)
	}
	return nil
}

// scanRecord reads one row in the order of columns, and refuses one that
// holds a record no Journal writes (ErrMalformedRecord).
func scanRecord(row interface{ Scan(...any) error }) (journal.Record, error) {
	var (
		r         journal.Record
		key       sql.NullString
		fp        []byte
		createdMs sql.NullInt64
		state     sql.NullInt16
		att, stat sql.NullInt64
		form      sql.NullInt16 // NULL (a column made by hand, rows of an older release): unrecorded
	)
	if err := row.Scan(&r.ActionID, &key, &fp, &createdMs, &state, &att, &stat, &form); err != nil {
		return journal.Record{}, err
	}
	// A table made by hand may allow NULL where Open's has NOT NULL.
	for _, c := range []struct {
		name  string
		valid bool
	}{{"key", key.Valid}, {"created_at", createdMs.Valid}, {"state", state.Valid}, {"attempts", att.Valid}, {"status", stat.Valid}} {
		if !c.valid {
			return journal.Record{}, malformed(r.ActionID, "%s is NULL", c.name)
		}
	}
	r.Key = key.String
	// Not ours to guess at: a fingerprint that cannot match would make
	// every resend fail as a different request.
	if len(fp) != len(r.Fingerprint) {
		return journal.Record{}, malformed(r.ActionID, "fingerprint of %d bytes", len(fp))
	}
	if st := journal.State(state.Int16); state.Int16 < 0 || state.Int16 > 255 || st < journal.StatePending || st > journal.StateUnknown {
		return journal.Record{}, malformed(r.ActionID, "state %d", state.Int16)
	}
	if form.Int16 < 0 || form.Int16 > 255 {
		return journal.Record{}, malformed(r.ActionID, "key form %d", form.Int16)
	}
	r.KeyForm = journal.KeyForm(form.Int16) // CheckRecord refuses a form above KeyFormQuoted
	copy(r.Fingerprint[:], fp)
	r.CreatedAt = time.UnixMilli(createdMs.Int64)
	r.State, r.Attempts, r.Status = journal.State(state.Int16), int(att.Int64), int(stat.Int64)
	// Nor is a record that no Reserve or Update would have stored: the
	// Transport would send it as it is (an empty key as no key at all).
	if err := journal.CheckRecord(r); err != nil {
		why := strings.TrimPrefix(err.Error(), journal.ErrInvalidRecord.Error()+": ")
		return journal.Record{}, malformed(r.ActionID, "%s", why)
	}
	return r, nil
}
