package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry/sqljournal"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
)

// journalCall is one of the Journal's calls that reach the database.
type journalCall struct {
	name string
	call func(ctx context.Context, j *sqljournal.Journal) error
}

// journalCalls returns every call, on the action of r (already reserved)
// and on fresh ones.
func journalCalls(r journal.Record) []journalCall {
	return []journalCall{
		{"Reserve", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Reserve(ctx, rec("pay:fresh", "k-fresh", 0, journal.StatePending), journal.ReuseAny)
			return err
		}},
		{"Update", func(ctx context.Context, j *sqljournal.Journal) error {
			u := r
			u.State, u.Attempts, u.Status = journal.StateDone, 1, 201
			return j.Update(ctx, u)
		}},
		{"Forget", func(ctx context.Context, j *sqljournal.Journal) error { return j.Forget(ctx, "pay:other") }},
		{"Unfinished", func(ctx context.Context, j *sqljournal.Journal) error { _, err := j.Unfinished(ctx); return err }},
		{"Expire", func(ctx context.Context, j *sqljournal.Journal) error { _, err := j.Expire(ctx); return err }},
		{"Lease", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Lease(ctx, r.ActionID, "machine-a", time.Minute)
			return err
		}},
		{"Release", func(ctx context.Context, j *sqljournal.Journal) error { return j.Release(ctx, r.ActionID, "machine-a") }},
	}
}

// recNow is a pending record created now, so that Expire keeps it when done.
func recNow(id, key string) journal.Record {
	r := rec(id, key, 0, journal.StatePending)
	r.CreatedAt = time.Now().Truncate(time.Millisecond)
	return r
}

// reservedJournal opens a Journal on a fresh table of db, closed when t
// ends, and reserves in it the record that journalCalls then works on.
func reservedJournal(t *testing.T, db *sql.DB) (*sqljournal.Journal, string, journal.Record) {
	t.Helper()
	j, table := openJournal(t, db)
	r := recNow("pay:1", "k1")
	mustReserve(t, j, r, journal.ReuseAny, true)
	return j, table, r
}

// driverError reports whether err carries an error of the driver or the
// network underneath the Journal's own wrapping.
func driverError(err error) bool {
	var (
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
		netErr  net.Error
	)
	return errors.As(err, &pgErr) || errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// unavailable fails t unless err says the journal is unavailable, keeps
// the driver's error, and carries the "idemretry: " prefix once.
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	switch {
	case !errors.Is(err, journal.ErrUnavailable):
		t.Errorf("%s: %v, want an error wrapping journal.ErrUnavailable", what, err)
	case !driverError(err) && !errors.Is(err, context.DeadlineExceeded):
		t.Errorf("%s: %v (%T), want the driver's error kept in the chain", what, err, errors.Unwrap(err))
	case strings.Count(err.Error(), "idemretry: ") != 1:
		t.Errorf("%s: %q, want the idemretry: prefix once", what, err)
	}
}

// With the server stopped, every call fails at once with an error that
// wraps journal.ErrUnavailable and the driver's error; once it is back, the
// same Journal works again.
func TestUnavailableServerStopped(t *testing.T) {
	c := ownCluster(t)
	db := c.db()
	ctx := context.Background()
	j, _, r := reservedJournal(t, db)

	c.stop()
	for _, call := range journalCalls(r) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := call.call(cctx, j)
		cancel()
		unavailable(t, call.name+" with the server stopped", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err := sqljournal.Open(cctx, db, sqljournal.WithTable("another"))
	cancel()
	unavailable(t, "Open with the server stopped", err)

	c.start()
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	if got.Key != "k1" {
		t.Fatalf("after the restart: key %s, want k1", got.Key)
	}
}

// A connection killed (pg_terminate_backend) while its statement waits
// fails the call with journal.ErrUnavailable and the server's error, and the
// statement did not take effect.
func TestUnavailableConnectionKilled(t *testing.T) {
	db := testDB(t)
	j, table, r := reservedJournal(t, db)
	ctx := context.Background()

	for _, call := range journalCalls(r) {
		holder, err := holdLock(db, lockTable(table))
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- call.call(ctx, j) }()
		pid, err := lockWaiter(db, table)
		if err != nil {
			t.Fatal(err)
		}
		var killed bool
		if err := db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
			t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, killed, err)
		}
		select {
		case err = <-errc:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not return after its connection was killed", call.name)
		}
		holder.Rollback()
		unavailable(t, call.name+" on a killed connection", err)
	}
	// Nothing the killed statements ran took effect, and the journal works.
	rows := rowsOf(t, db, table)
	if len(rows) != 1 || rows[0].key != "k1" || rows[0].state != journal.StatePending {
		t.Fatalf("after the killed calls: %+v, want pay:1 pending alone", rows)
	}
	for _, call := range journalCalls(r) {
		if err := call.call(ctx, j); err != nil {
			t.Errorf("%s after the kills: %v", call.name, err)
		}
	}
}

// A call that runs out of its context's time while the database hangs (a
// lock held elsewhere) returns by the deadline with an error wrapping both
// journal.ErrUnavailable and context.DeadlineExceeded. A caller's own
// cancellation is reported as such.
func TestUnavailableDeadline(t *testing.T) {
	db := testDB(t)
	j, table, r := reservedJournal(t, db)
	ctx := context.Background()
	holder, err := holdLock(db, lockTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	for _, call := range journalCalls(r) {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := call.call(cctx, j)
		cancel()
		unavailable(t, call.name+" past its deadline", err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s past its deadline: %v, want context.DeadlineExceeded too", call.name, err)
		}

		cctx, cancel = context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		if err := call.call(cctx, j); !errors.Is(err, context.Canceled) {
			t.Errorf("%s cancelled: %v, want context.Canceled", call.name, err)
		}
		cancel()
	}
}

// A server that stops answering (every process SIGSTOPped: connections
// stay open, the kernel still accepts new ones) holds no call past its
// context's deadline, with pgx's default cancellation and with a driver
// whose cancellation waits for the server (pgx told to ignore the context,
// as a driver that only sends the server a cancel request would).
func TestBoundedPausedServer(t *testing.T) {
	c := ownCluster(t)
	for _, tc := range []struct {
		name string
		db   func() *sql.DB
	}{
		{"pgx", c.db},
		{"cancellation waits for the server", func() *sql.DB {
			cfg, err := pgx.ParseConfig(c.dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.BuildContextWatcherHandler = func(*pgconn.PgConn) ctxwatch.Handler { return ignoreCancel{} }
			db := stdlib.OpenDB(*cfg)
			db.SetMaxOpenConns(10)
			db.SetMaxIdleConns(10)
			t.Cleanup(func() { db.Close() })
			return db
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, _, r := reservedJournal(t, tc.db())
			ctx := context.Background()
			calls := journalCalls(r)
			for _, call := range calls { // warm the pool: paused connections, not refused ones
				if err := call.call(ctx, j); err != nil {
					t.Fatal(err)
				}
			}
			c.pause()
			defer c.resume()
			const deadline = 300 * time.Millisecond
			for _, call := range calls {
				var err error
				took := within(t, 10*time.Second, call.name+" on a paused server", func() {
					cctx, cancel := context.WithTimeout(ctx, deadline)
					defer cancel()
					err = call.call(cctx, j)
				})
				if took > deadline+time.Second {
					t.Errorf("%s took %v with a %v deadline", call.name, took, deadline)
				}
				unavailable(t, call.name+" on a paused server", err)
			}
			c.resume()
			if got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false); got.Key != "k1" {
				t.Fatalf("after the pause: key %s, want k1", got.Key)
			}
		})
	}
}

// ignoreCancel is a pgx context handler that does nothing when a context
// ends: a statement then waits for the server's answer, however long.
type ignoreCancel struct{}

func (ignoreCancel) HandleCancel(context.Context) {}
func (ignoreCancel) HandleUnwatchAfterCancel()    {}

// A row lock held by another session (here up to 3 s, as a slow
// transaction elsewhere would) holds no Update, Reserve, Lease, Release or
// Forget past its context's deadline.
func TestBoundedRowLock(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	pending := recNow("pay:pending", "k1")
	mustReserve(t, j, pending, journal.ReuseAny, true)
	done := recNow("fp:done", "k2")
	mustReserve(t, j, done, journal.ReusePending, true)
	done.State, done.Status = journal.StateDone, 201
	if err := j.Update(ctx, done); err != nil {
		t.Fatal(err)
	}
	calls := []journalCall{
		{"Update", func(ctx context.Context, j *sqljournal.Journal) error {
			u := pending
			u.State, u.Attempts, u.Status = journal.StateDone, 1, 201
			return j.Update(ctx, u)
		}},
		{"Reserve replacing done", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Reserve(ctx, recNow("fp:done", "k3"), journal.ReusePending)
			return err
		}},
		// A Lease or Release that changes nothing (refused, or not the
		// holder's) does not wait for the row: these renew and end one.
		{"Lease", func(ctx context.Context, j *sqljournal.Journal) error {
			_, _, err := j.Lease(ctx, "pay:pending", "machine-a", time.Minute)
			return err
		}},
		{"Release", func(ctx context.Context, j *sqljournal.Journal) error {
			return j.Release(ctx, "pay:pending", "machine-a")
		}},
		{"Forget", func(ctx context.Context, j *sqljournal.Journal) error { return j.Forget(ctx, "pay:pending") }},
	}
	if held, _, err := j.Lease(ctx, "pay:pending", "machine-a", time.Hour); !held || err != nil {
		t.Fatalf("Lease: %v, %v", held, err)
	}
	for _, call := range calls {
		holder, err := holdLock(db, lockRows(table))
		if err != nil {
			t.Fatal(err)
		}
		release := time.AfterFunc(3*time.Second, func() { holder.Rollback() })
		const deadline = 500 * time.Millisecond
		cctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		err = call.call(cctx, j)
		took := time.Since(start)
		cancel()
		if took > deadline+time.Second {
			t.Errorf("%s took %v with a %v deadline under a row lock", call.name, took, deadline)
		}
		unavailable(t, call.name+" under a row lock", err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s under a row lock: %v, want context.DeadlineExceeded too", call.name, err)
		}
		release.Stop()
		holder.Rollback()
	}
}
