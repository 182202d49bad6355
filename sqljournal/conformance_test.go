package sqljournal_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/journal/journaltest"
	"github.com/idemretry/idemretry/sqljournal"
)

// These tests state journal.Memory's semantics as a contract and run against
// both journal.Memory (so the contract is checked to be its behaviour) and
// the SQL journal. Times are whole milliseconds: the SQL journal, like the
// file journal, stores creation times in Unix milliseconds.

type factory func(t *testing.T) journal.Journal

func TestConformanceMemory(t *testing.T) {
	runConformance(t, func(t *testing.T) journal.Journal {
		j := journal.NewMemory()
		t.Cleanup(func() { j.Close() })
		return j
	})
}

func TestConformanceSQL(t *testing.T) {
	db := testDB(t)
	runConformance(t, func(t *testing.T) journal.Journal {
		j, _ := openJournal(t, db)
		return j
	})
}

func TestConformanceSQLHashed(t *testing.T) {
	db := testDB(t)
	runConformance(t, func(t *testing.T) journal.Journal {
		j, _ := openJournal(t, db, sqljournalHashed())
		return j
	})
}

var t0 = time.UnixMilli(1_780_000_000_000)

func rec(id, key string, at time.Duration, st journal.State) journal.Record {
	return journal.Record{
		ActionID: id, Key: key, Fingerprint: sha256.Sum256([]byte("body of " + id)),
		CreatedAt: t0.Add(at), State: st,
	}
}

// sameRecord compares records field by field, times with Equal.
func sameRecord(t *testing.T, what string, got, want journal.Record) {
	t.Helper()
	if got.ActionID != want.ActionID || got.Key != want.Key || got.Fingerprint != want.Fingerprint ||
		!got.CreatedAt.Equal(want.CreatedAt) || got.State != want.State ||
		got.Attempts != want.Attempts || got.Status != want.Status {
		t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

func mustReserve(t *testing.T, j journal.Journal, r journal.Record, mode journal.ReserveMode, wantCreated bool) journal.Record {
	t.Helper()
	got, created, err := j.Reserve(context.Background(), r, mode)
	if err != nil {
		t.Fatalf("Reserve(%s): %v", r.ActionID, err)
	}
	if created != wantCreated {
		t.Fatalf("Reserve(%s): created = %v, want %v", r.ActionID, created, wantCreated)
	}
	return got
}

func runConformance(t *testing.T, newJournal factory) {
	ctx := context.Background()
	bg := journal.ReuseAny

	t.Run("ReserveCreatesThenReuses", func(t *testing.T) {
		j := newJournal(t)
		first := rec("pay:1", "k1", 0, journal.StatePending)
		first.Attempts, first.Status = 2, 0
		sameRecord(t, "created", mustReserve(t, j, first, bg, true), first)
		again := rec("pay:1", "k2", time.Hour, journal.StatePending)
		sameRecord(t, "reused", mustReserve(t, j, again, bg, false), first)
		sameRecord(t, "reused pending", mustReserve(t, j, again, journal.ReusePending, false), first)
	})

	t.Run("ReuseAnyKeepsDone", func(t *testing.T) {
		j := newJournal(t)
		first := rec("pay:1", "k1", 0, journal.StatePending)
		mustReserve(t, j, first, bg, true)
		first.State, first.Attempts, first.Status = journal.StateDone, 3, 201
		if err := j.Update(ctx, first); err != nil {
			t.Fatal(err)
		}
		sameRecord(t, "done reused", mustReserve(t, j, rec("pay:1", "k2", time.Second, journal.StatePending), bg, false), first)
	})

	t.Run("ReusePendingReplacesDoneOnly", func(t *testing.T) {
		j := newJournal(t)
		for _, st := range []journal.State{journal.StatePending, journal.StateUnknown} {
			id := "fp:" + st.String()
			first := rec(id, "k1", 0, st)
			mustReserve(t, j, first, bg, true)
			sameRecord(t, "kept "+st.String(), mustReserve(t, j, rec(id, "k2", time.Second, journal.StatePending), journal.ReusePending, false), first)
		}
		first := rec("fp:done", "k1", 0, journal.StatePending)
		mustReserve(t, j, first, journal.ReusePending, true)
		first.State, first.Status = journal.StateDone, 200
		if err := j.Update(ctx, first); err != nil {
			t.Fatal(err)
		}
		next := rec("fp:done", "k2", time.Minute, journal.StatePending)
		sameRecord(t, "replaced", mustReserve(t, j, next, journal.ReusePending, true), next)
		sameRecord(t, "replacement kept", mustReserve(t, j, rec("fp:done", "k3", time.Hour, journal.StatePending), journal.ReusePending, false), next)
	})

	t.Run("UpdateTouchesStateAttemptsStatusOnly", func(t *testing.T) {
		j := newJournal(t)
		first := rec("pay:1", "k1", 0, journal.StatePending)
		mustReserve(t, j, first, bg, true)
		change := rec("pay:1", "k1", time.Hour, journal.StateDone)
		change.Fingerprint = sha256.Sum256([]byte("other"))
		change.Attempts, change.Status = 4, 422
		if err := j.Update(ctx, change); err != nil {
			t.Fatal(err)
		}
		want := first
		want.State, want.Attempts, want.Status = journal.StateDone, 4, 422
		sameRecord(t, "after update", mustReserve(t, j, first, bg, false), want)
	})

	t.Run("UpdateMissing", func(t *testing.T) {
		j := newJournal(t)
		err := j.Update(ctx, rec("nobody", "k", 0, journal.StateDone))
		if !errors.Is(err, journal.ErrNotFound) {
			t.Fatalf("Update of a missing action: %v, want journal.ErrNotFound", err)
		}
	})

	t.Run("UpdateOtherKey", func(t *testing.T) {
		j := newJournal(t)
		first := rec("pay:1", "k1", 0, journal.StatePending)
		mustReserve(t, j, first, bg, true)
		change := rec("pay:1", "k2", 0, journal.StateDone)
		change.Attempts, change.Status = 4, 201
		if err := j.Update(ctx, change); !errors.Is(err, journal.ErrNotFound) {
			t.Fatalf("Update under another key: %v, want journal.ErrNotFound", err)
		}
		sameRecord(t, "untouched", mustReserve(t, j, first, bg, false), first)
	})

	t.Run("UnfinishedOldestFirst", func(t *testing.T) {
		j := newJournal(t)
		if got, err := j.Unfinished(ctx); err != nil || len(got) != 0 {
			t.Fatalf("empty journal: %v, %v", got, err)
		}
		// Equal times order by bytes: "B" < "a" < "b", whatever the
		// database's collation says.
		all := []journal.Record{
			rec("a", "k-a", 2*time.Second, journal.StatePending),
			rec("late", "k-late", time.Hour, journal.StateUnknown),
			rec("done", "k-done", 0, journal.StateDone),
			rec("b", "k-b", 2*time.Second, journal.StateUnknown),
			rec("B", "k-B", 2*time.Second, journal.StatePending),
			rec("first", "k-first", -time.Hour, journal.StatePending),
		}
		for _, r := range all {
			mustReserve(t, j, r, bg, true)
		}
		got, err := j.Unfinished(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"first", "B", "a", "b", "late"}
		if len(got) != len(want) {
			t.Fatalf("Unfinished: %d records %+v, want %v", len(got), got, want)
		}
		// Hashed ids are returned, and break ties, in their digest form:
		// then only the times' order is checked for the tied three.
		hashed := false
		for _, r := range got {
			hashed = hashed || strings.HasPrefix(r.ActionID, "sha256:")
		}
		for i, r := range got {
			w := want[i]
			if hashed && i >= 1 && i <= 3 {
				w = strings.TrimPrefix(r.Key, "k-")
				if !strings.Contains("Bab", w) {
					t.Errorf("Unfinished[%d] = %+v, want one of B, a, b", i, r)
				}
			}
			if r.Key != "k-"+w || (!hashed && r.ActionID != w) {
				t.Errorf("Unfinished[%d] = %s (%s), want %s", i, r.ActionID, r.Key, w)
			}
		}
	})

	t.Run("Forget", func(t *testing.T) {
		j := newJournal(t)
		mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), bg, true)
		if err := j.Forget(ctx, "pay:1"); err != nil {
			t.Fatal(err)
		}
		if err := j.Forget(ctx, "pay:1"); err != nil {
			t.Fatalf("Forget of a missing action: %v, want nil", err)
		}
		if got, _ := j.Unfinished(ctx); len(got) != 0 {
			t.Fatalf("Unfinished after Forget: %+v", got)
		}
		next := rec("pay:1", "k2", time.Second, journal.StatePending)
		sameRecord(t, "after forget", mustReserve(t, j, next, bg, true), next)
	})

	t.Run("Close", func(t *testing.T) {
		j := newJournal(t)
		mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), bg, true)
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		if err := j.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		_, _, err := j.Reserve(ctx, rec("pay:2", "k", 0, journal.StatePending), bg)
		check := func(op string, err error) {
			if !errors.Is(err, journal.ErrClosed) {
				t.Errorf("%s after Close: %v, want journal.ErrClosed", op, err)
			}
		}
		check("Reserve", err)
		check("Update", j.Update(ctx, rec("pay:1", "k1", 0, journal.StateDone)))
		_, err = j.Unfinished(ctx)
		check("Unfinished", err)
		check("Forget", j.Forget(ctx, "pay:1"))
	})

	t.Run("ReserveCanceled", func(t *testing.T) {
		j := newJournal(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, _, err := j.Reserve(cctx, rec("pay:1", "k1", 0, journal.StatePending), bg)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Reserve with a canceled context: %v, want context.Canceled", err)
		}
		mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), bg, true)
	})
}

// The project's shared conformance suite, as every Journal runs it, with a
// stalled database for BoundedByContext: another session holds an ACCESS
// EXCLUSIVE lock on the journal's table, so every statement on it waits.
func TestJournalTestSuite(t *testing.T) {
	db := testDB(t)
	var tables sync.Map // *sqljournal.Journal -> its table
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, table := openJournal(t, db)
		tables.Store(j, table)
		return j
	}, journaltest.Stall(stallTable(db, &tables)), journaltest.EarlierCreatedAt(time.Minute),
		journaltest.Corrupt(updateRow(db, &tables, false)))
}

func TestJournalTestSuiteHashed(t *testing.T) {
	db := testDB(t)
	var tables sync.Map
	journaltest.Run(t, func(t *testing.T) journal.Journal {
		j, table := openJournal(t, db, sqljournal.WithHashedIDs())
		tables.Store(j, table)
		return j
	}, journaltest.ReportedIDs(func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return "sha256:" + hex.EncodeToString(sum[:])
	}), journaltest.Stall(stallTable(db, &tables)), journaltest.EarlierCreatedAt(time.Minute),
		journaltest.Corrupt(updateRow(db, &tables, true)))
}

// updateRow returns a Corrupt for journaltest: an UPDATE of the row of
// rec.ActionID (its digest, if hashed) that sets every column to rec's
// values, as someone else's statement on the table would. A value the
// columns cannot hold (attempts or status past an integer's range) skips
// the case.
func updateRow(db *sql.DB, tables *sync.Map, hashed bool) func(t *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error) {
	return func(t *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error) {
		t.Helper()
		table, ok := tables.Load(j)
		if !ok {
			t.Fatalf("corrupt: unknown journal %p", j)
		}
		if int64(rec.Attempts) != int64(int32(rec.Attempts)) || int64(rec.Status) != int64(int32(rec.Status)) ||
			int64(rec.State) != int64(int16(rec.State)) {
			t.Skipf("the table's integer columns cannot hold %+v", rec)
		}
		id := rec.ActionID
		if hashed {
			id = journal.Digest(id)
		}
		res, err := db.Exec(`UPDATE "`+table.(string)+`" SET key = $2, fingerprint = $3, created_at = $4, state = $5, attempts = $6, status = $7,
			key_form = $8 WHERE action_id = $1`, id, rec.Key, rec.Fingerprint[:], rec.CreatedAt.UnixMilli(), int16(rec.State), rec.Attempts, rec.Status,
			int16(rec.KeyForm))
		if err != nil {
			t.Fatalf("corrupt: %v", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("corrupt: %d rows updated", n)
		}
		return j, nil
	}
}

// stallTable returns a stall for journaltest: a transaction of its own that
// locks the journal's table in ACCESS EXCLUSIVE mode (which every read and
// write waits for) until release rolls it back.
func stallTable(db *sql.DB, tables *sync.Map) func(t *testing.T, j journal.Journal) func() {
	return func(t *testing.T, j journal.Journal) func() {
		t.Helper()
		table, ok := tables.Load(j)
		if !ok {
			t.Fatalf("stall: unknown journal %p", j)
		}
		tx, err := holdLock(db, lockTable(table.(string)))
		if err != nil {
			t.Fatalf("stall: %v", err)
		}
		return func() {
			if err := tx.Rollback(); err != nil {
				t.Errorf("release stall: %v", err)
			}
		}
	}
}
