package sqljournal_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/idemretry/idemretry/sqljournal"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
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
	j, err := sqljournal.Open(context.Background(), db, append([]sqljournal.Option{sqljournal.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { j.Close() })
	return j, table
}
