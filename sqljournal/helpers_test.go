package sqljournal_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemretry/idemretry/sqljournal"
)

// dsnEnv names the variable that points the tests at a PostgreSQL server;
// .ci/postgres.sh starts one and prints it.
const dsnEnv = "IDEMRETRY_PG_DSN"

// testDB returns a pool on the test server, closed when t ends. Without a
// server the test is skipped, except in CI, where a missing server is a
// broken pipeline and must not pass quietly.
func testDB(t testing.TB) *sql.DB {
	t.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is unset, and CI=true: CI must provide a PostgreSQL server (eval \"$(bash .ci/postgres.sh)\")", dsnEnv)
		}
		t.Skipf("%s is unset: no PostgreSQL to test against; run eval \"$(bash ../.ci/postgres.sh)\" first", dsnEnv)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	// Bounded so that the 100-goroutine tests queue in the pool instead of
	// exhausting a default server's 100 connections, and all kept idle so
	// that each round does not reconnect.
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("ping %s: %v", dsnEnv, err)
	}
	return db
}

// newTable returns a fresh table name, dropped when t ends, so that tests
// are independent of each other and of earlier runs.
func newTable(t testing.TB, db *sql.DB) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "sqlj_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+name+`"`); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

// openJournal opens a Journal on a fresh table of db, closed when t ends.
func openJournal(t testing.TB, db *sql.DB, opts ...sqljournal.Option) (*sqljournal.Journal, string) {
	t.Helper()
	table := newTable(t, db)
	return openOn(t, db, table, opts...), table
}

// openOn opens a Journal on table through db, closed when t ends. Given a
// pool of its own (testDB), it is another machine as far as the database
// can tell: separate connections, no shared memory.
func openOn(t testing.TB, db *sql.DB, table string, opts ...sqljournal.Option) *sqljournal.Journal {
	t.Helper()
	j, err := sqljournal.Open(context.Background(), db, append([]sqljournal.Option{sqljournal.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

// lockTable and lockRows are statements for holdLock: an ACCESS EXCLUSIVE
// lock on the table, which every read and write of it waits for, or row
// locks on every row, which updates and deletes of them wait for.
func lockTable(table string) string { return `LOCK TABLE "` + table + `" IN ACCESS EXCLUSIVE MODE` }
func lockRows(table string) string  { return `SELECT 1 FROM "` + table + `" FOR UPDATE` }

// holdLock begins a transaction of its own on db and runs lock in it (see
// lockTable and lockRows). The lock is held until the caller rolls the
// transaction back.
func holdLock(db *sql.DB, lock string) (*sql.Tx, error) {
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(lock); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// lockWaiter returns the pid of the backend whose statement on table waits
// for a lock, once there is one (within 30 s).
func lockWaiter(db *sql.DB, table string) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var pid int
		err := db.QueryRow(`SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()
			AND strpos(query, $1) > 0 LIMIT 1`, `"`+table+`"`).Scan(&pid)
		switch {
		case err == nil:
			return pid, nil
		case !errors.Is(err, sql.ErrNoRows):
			return 0, err
		case time.Now().After(deadline):
			return 0, fmt.Errorf("no statement on %s waits for a lock", table)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dbClockNow reads the database's clock now (clock_timestamp), to the
// microsecond.
func dbClockNow(t testing.TB, db *sql.DB) time.Time {
	t.Helper()
	var us int64
	if err := db.QueryRowContext(context.Background(), `SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`).Scan(&us); err != nil {
		t.Fatal(err)
	}
	return time.UnixMicro(us)
}

// noLockWaiter returns once no statement on table waits for a lock (within
// 30 s).
func noLockWaiter(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()
			AND strpos(query, $1) > 0`, `"`+table+`"`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d statements on %s still wait for a lock", n, table)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pgProxy forwards loopback connections to the test server, until cut:
// then every connection through it is closed and new ones are refused, as
// a network partition between one machine and the database does. While
// frozen it holds every byte in both directions, connections open, as a
// database that stopped answering (a paused server, a dropped route).
type pgProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
	frozen chan struct{} // closed by thaw; nil when not frozen
	wg     sync.WaitGroup
}

// freeze holds every byte through p until thaw (or partition).
func (p *pgProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil && !p.cut {
		p.frozen = make(chan struct{})
	}
}

// thaw lets the bytes held since freeze through.
func (p *pgProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// pipe copies src to dst, holding each read while p is frozen.
func (p *pgProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.frozen
			p.mu.Unlock()
			if frozen != nil {
				<-frozen
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func newPGProxy(t *testing.T, target string) *pgProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{l: l, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { p.partition(); p.wg.Wait() })
	return p
}

// proxiedDB returns a pool on the test server through a pgProxy of its
// own, both closed when t ends.
func proxiedDB(t *testing.T) (*sql.DB, *pgProxy) {
	t.Helper()
	testDB(t) // skip or fail as every PostgreSQL test does
	u, err := url.Parse(os.Getenv(dsnEnv))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newPGProxy(t, u.Host)
	u.Host = proxy.l.Addr().String()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, proxy
}

func (p *pgProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		p.mu.Lock()
		if err != nil || p.cut {
			p.mu.Unlock()
			c.Close()
			if s != nil {
				s.Close()
			}
			continue
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

func (p *pgProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
}
