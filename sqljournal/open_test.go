package sqljournal_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

func TestOpenRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	invalid := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sqljournal.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", what, err)
		} else if msg := err.Error(); !strings.HasPrefix(msg, "sqljournal: ") || strings.Count(msg, "idemretry: ") != 1 {
			t.Errorf("%s: %q, want the sqljournal: prefix and idemretry: once", what, msg)
		}
	}
	_, err := sqljournal.Open(ctx, nil)
	invalid("nil db", err)
	db := testDB(t)
	bad := []string{"", "1abc", "a-b", `a"; DROP TABLE x; --`, "a.b.c", ".a", "a.", "tab le",
		"é", strings.Repeat("a", 49), "a\x00"}
	for _, name := range bad {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(name))
		invalid(fmt.Sprintf("table %q", name), err)
	}
	for _, d := range []time.Duration{0, -time.Hour, math.MinInt64} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(d))
		invalid(fmt.Sprintf("key window %v", d), err)
	}
	for _, d := range []time.Duration{-time.Nanosecond, -time.Hour, math.MinInt64} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithGrace(d))
		invalid(fmt.Sprintf("grace %v", d), err)
	}
	// Their sum must be a time.Duration: not wrapped round, not clamped.
	_, err = sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(math.MaxInt64/2+1), sqljournal.WithGrace(math.MaxInt64/2+1))
	invalid("key window and grace over the longest duration", err)
	_, err = sqljournal.Open(ctx, db, sqljournal.WithKeyWindow(math.MaxInt64), sqljournal.WithGrace(time.Nanosecond))
	invalid("the longest key window plus a nanosecond", err)
	_, err = sqljournal.Open(ctx, db, sqljournal.WithNow(nil))
	invalid("nil clock", err)
}

func TestOpenWithoutCreateTable(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	table := newTable(t, db)
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable()); err == nil {
		t.Fatal("Open of a missing table without creating it succeeded")
	}
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	j, err = sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable())
	if err != nil {
		t.Fatalf("Open of an existing table: %v", err)
	}
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
}

func TestOpenRejectsForeignTable(t *testing.T) {
	db := testDB(t)
	table := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + table + `" (action_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := sqljournal.Open(context.Background(), db, sqljournal.WithTable(table)); !errors.Is(err, journal.ErrIncompatible) {
		t.Fatalf("Open of a table without the journal's columns: %v, want journal.ErrIncompatible", err)
	}
}

func TestOpenSchemaQualified(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	var b [6]byte
	rand.Read(b[:])
	schema := "sqlj_schema_" + hex.EncodeToString(b[:])
	if _, err := db.Exec(`CREATE SCHEMA "` + schema + `"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DROP SCHEMA "` + schema + `" CASCADE`) })
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(schema+".Keys"))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "` + schema + `"."Keys"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in %s.Keys: %d, %v", schema, n, err)
	}
}

// Machines of a fleet start together; creating the table must not trip
// over itself.
func TestOpenConcurrently(t *testing.T) {
	db := testDB(t)
	table := newTable(t, db)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := sqljournal.Open(context.Background(), db, sqljournal.WithTable(table))
			if err != nil {
				t.Errorf("concurrent Open: %v", err)
				return
			}
			j.Close()
		}()
	}
	wg.Wait()
}

func TestCloseLeavesDBOpen(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("db after Journal.Close: %v", err)
	}
}

func TestMalformedRecord(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	if _, err := db.Exec(`INSERT INTO "` + table + `" VALUES ('pay:1', 'k', '\x0102'::bytea, 0, 1, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	malformed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sqljournal.ErrMalformedRecord) {
			t.Errorf("%s: %v, want ErrMalformedRecord", what, err)
		} else if msg := err.Error(); strings.Count(msg, "idemretry: ") != 1 || strings.Count(msg, "sqljournal: ") != 1 {
			t.Errorf("%s: %q, want the sqljournal: and idemretry: prefixes once each", what, msg)
		}
	}
	_, _, err := j.Reserve(ctx, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny)
	malformed("Reserve of a malformed record", err)
	_, err = j.Unfinished(ctx)
	malformed("Unfinished with a malformed record", err)
}
