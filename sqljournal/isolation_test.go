package sqljournal_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry/sqljournal"
)

// Reserve relies on READ COMMITTED: under a database whose default
// isolation is REPEATABLE READ or SERIALIZABLE (a common DBA setting for
// payment databases), INSERT ... ON CONFLICT meeting a row committed after
// the statement's snapshot fails with SQLSTATE 40001 instead of returning
// the winner. Reserve begins its own READ COMMITTED transaction, so
// concurrent Reserves of one action agree on one key whatever the default.
// (Found in review: they failed spuriously.)
func TestReserveUnderSerializableDefault(t *testing.T) {
	dsn := os.Getenv("IDEMRETRY_PG_DSN")
	if dsn == "" {
		t.Skip("no PostgreSQL")
	}
	testDB(t) // skip/fail consistently with the other tests
	db, err := sql.Open("pgx", dsn+"&default_transaction_isolation=serializable")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)
	t.Cleanup(func() { db.Close() })
	var iso string
	if err := db.QueryRowContext(context.Background(), `SHOW transaction_isolation`).Scan(&iso); err != nil || iso != "serializable" {
		t.Fatalf("isolation %q, %v", iso, err)
	}
	j, _ := openJournal(t, db)
	for _, mode := range []journal.ReserveMode{journal.ReuseAny, journal.ReusePending} {
		for round := range 20 {
			keys, created := raceReserve(t, []journal.Journal{j}, fmt.Sprintf("pay:%d-%d", mode, round), 16, mode)
			if t.Failed() {
				return
			}
			oneKey(t, keys, created, 16)
		}
	}
	_ = sqljournal.DefaultTable
}
