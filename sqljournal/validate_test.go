package sqljournal_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry/sqljournal"
)

func TestInvalidRecordsRefused(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	bad := map[string]func(r *journal.Record){
		"empty id":        func(r *journal.Record) { r.ActionID = "" },
		"NUL in id":       func(r *journal.Record) { r.ActionID = "pay:\x00" },
		"invalid UTF-8":   func(r *journal.Record) { r.ActionID = "pay:\xff" },
		"long id":         func(r *journal.Record) { r.ActionID = strings.Repeat("x", journal.MaxActionID+1) },
		"empty key":       func(r *journal.Record) { r.Key = "" },
		"long key":        func(r *journal.Record) { r.Key = strings.Repeat("k", 256) },
		"space in key":    func(r *journal.Record) { r.Key = "a b" },
		"NUL in key":      func(r *journal.Record) { r.Key = "k\x00" },
		"state 0":         func(r *journal.Record) { r.State = 0 },
		"state 4":         func(r *journal.Record) { r.State = 4 },
		"attempts < 0":    func(r *journal.Record) { r.Attempts = -1 },
		"status < 0":      func(r *journal.Record) { r.Status = -1 },
		"attempts > 2^31": func(r *journal.Record) { n := uint64(1) << 31; r.Attempts = int(n) }, // wraps negative where an int is 32 bits: refused all the same
	}
	for name, spoil := range bad {
		r := rec("pay:1", "k1", 0, journal.StatePending)
		spoil(&r)
		if _, _, err := j.Reserve(ctx, r, journal.ReuseAny); !errors.Is(err, journal.ErrInvalidRecord) {
			t.Errorf("Reserve with %s: %v, want journal.ErrInvalidRecord", name, err)
		} else if strings.Count(err.Error(), "idemretry: ") != 1 {
			t.Errorf("Reserve with %s: %q, want the idemretry: prefix once", name, err)
		}
	}
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	for name, spoil := range bad {
		r := rec("pay:1", "k1", 0, journal.StateDone)
		spoil(&r)
		err := j.Update(ctx, r)
		if strings.Contains(name, "key") {
			// No record has such a key: Update matches the key.
			if !errors.Is(err, journal.ErrNotFound) {
				t.Errorf("Update with %s: %v, want journal.ErrNotFound", name, err)
			}
			continue
		}
		if !errors.Is(err, journal.ErrInvalidRecord) {
			t.Errorf("Update with %s: %v, want journal.ErrInvalidRecord", name, err)
		}
	}
	if err := j.Forget(ctx, "pay:\x00"); err != nil {
		t.Errorf("Forget of an id no record can have: %v", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "` + table + `"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("table holds %d rows (%v), want the one valid record", n, err)
	}
}

// Hashed, any non-empty id is storable: the table holds only its digest.
func TestHashedIDsTakeAnyBytes(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db, sqljournal.WithHashedIDs())
	for _, id := range []string{"pay:\x00", "pay:\xff", strings.Repeat("x", 4096)} {
		mustReserve(t, j, rec(id, "k1", 0, journal.StatePending), journal.ReuseAny, true)
		if err := j.Forget(context.Background(), id); err != nil {
			t.Errorf("Forget(%.10q): %v", id, err)
		}
	}
}
