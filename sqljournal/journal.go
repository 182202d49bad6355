package sqljournal

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry"
)

// Journal is an [idemretry.Journal] in a PostgreSQL table, shared by every
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
// Errors wrap [idemretry.ErrJournalClosed] after [Journal.Close],
// [idemretry.ErrActionNotFound] from [Journal.Update], the context's error
// when it ends, and otherwise the driver's error. A failed write may still
// have been committed (the answer was lost, as with any database call); the
// Transport sends nothing after a failed Reserve, and the next Reserve then
// returns the committed record.
type Journal struct {
	db     *sql.DB
	cfg    config
	q      queries
	closed atomic.Bool
}

var _ idemretry.Journal = (*Journal)(nil)

// Open returns a Journal that keeps its records in db, creating the table
// (and two partial indexes) if it is missing, unless [WithoutCreateTable].
// The caller owns db: [Journal.Close] leaves it open, and its pool settings
// bound how many statements the Journal runs at once. The table is
//
//	action_id   text PRIMARY KEY  -- as given, or hashed (WithHashedActionIDs)
//	key         text              -- the Idempotency-Key, bare
//	fingerprint bytea             -- SHA-256 of the first request
//	created_at  bigint            -- when the key was minted, Unix milliseconds
//	state       smallint          -- idemretry.State: 1 pending, 2 done, 3 unknown
//	attempts    integer
//	status      integer           -- final HTTP status when done, else 0
//
// Open fails with an error wrapping [idemretry.ErrInvalidOption] for a bad
// option, or with the database's error if the table cannot be created or
// lacks those columns.
func Open(ctx context.Context, db *sql.DB, opts ...Option) (*Journal, error) {
	if db == nil {
		return nil, fmt.Errorf("sqljournal: nil *sql.DB: %w", idemretry.ErrInvalidOption)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := parseTable(cfg.table)
	if err != nil {
		return nil, err
	}
	if cfg.createTable {
		if err := createSchema(ctx, db, t); err != nil {
			return nil, fmt.Errorf("sqljournal: create table %s: %w", t.quoted, err)
		}
	}
	if err := checkSchema(ctx, db, t); err != nil {
		return nil, fmt.Errorf("sqljournal: table %s: %w", t.quoted, err)
	}
	return &Journal{db: db, cfg: cfg, q: newQueries(t)}, nil
}

// Close marks the Journal closed: later calls fail with an error wrapping
// [idemretry.ErrJournalClosed]. There is nothing to flush, since every
// method has finished its statement when it returns, and db stays open for
// its owner. Close is safe to call more than once and always returns nil.
func (j *Journal) Close() error {
	j.closed.Store(true)
	return nil
}

// usable returns why a call cannot run, if it cannot.
func (j *Journal) usable(ctx context.Context, op string) error {
	if j.closed.Load() {
		return fmt.Errorf("sqljournal: %s: %w", op, idemretry.ErrJournalClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqljournal: %s: %w", op, err)
	}
	return nil
}

// scanRecord reads one row in the order of columns.
func scanRecord(row interface{ Scan(...any) error }) (idemretry.Record, error) {
	var (
		r         idemretry.Record
		fp        []byte
		createdMs int64
		state     int16
		att, stat int64
	)
	if err := row.Scan(&r.ActionID, &r.Key, &fp, &createdMs, &state, &att, &stat); err != nil {
		return idemretry.Record{}, err
	}
	// Not ours to guess at: a fingerprint that cannot match would make
	// every resend fail as a different request.
	if len(fp) != len(r.Fingerprint) {
		return idemretry.Record{}, fmt.Errorf("sqljournal: action %q: fingerprint of %d bytes: %w", r.ActionID, len(fp), ErrMalformedRecord)
	}
	if st := idemretry.State(state); state < 0 || state > 255 || st < idemretry.StatePending || st > idemretry.StateUnknown {
		return idemretry.Record{}, fmt.Errorf("sqljournal: action %q: state %d: %w", r.ActionID, state, ErrMalformedRecord)
	}
	copy(r.Fingerprint[:], fp)
	r.CreatedAt = time.UnixMilli(createdMs)
	r.State, r.Attempts, r.Status = idemretry.State(state), int(att), int(stat)
	return r, nil
}
