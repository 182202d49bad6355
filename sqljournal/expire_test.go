package sqljournal_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

func TestExpireDropsOnlyOldDone(t *testing.T) {
	db := testDB(t)
	var now atomic.Int64
	now.Store(t0.UnixMilli())
	// Kept for the key window plus the grace: 48 hours.
	j, _ := openJournal(t, db, sqljournal.WithKeyWindow(36*time.Hour), sqljournal.WithGrace(12*time.Hour),
		sqljournal.WithClock(func() time.Time { return time.UnixMilli(now.Load()) }))
	ctx := context.Background()
	records := []journal.Record{
		rec("old-done", "k1", -72*time.Hour, journal.StateDone),
		rec("old-pending", "k2", -72*time.Hour, journal.StatePending),
		rec("old-unknown", "k3", -72*time.Hour, journal.StateUnknown),
		rec("new-done", "k4", -time.Hour, journal.StateDone),
		rec("edge-done", "k5", -48*time.Hour, journal.StateDone), // exactly window + grace: kept
	}
	for _, r := range records {
		mustReserve(t, j, r, journal.ReuseAny, true)
	}
	n, err := j.Expire(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Expire: %d, %v; want 1 deleted", n, err)
	}
	// The expired done action gets a new key; the others keep theirs.
	for _, r := range records {
		fresh := r
		fresh.Key = "new"
		got, created, err := j.Reserve(ctx, fresh, journal.ReuseAny)
		if err != nil {
			t.Fatal(err)
		}
		if wantNew := r.ActionID == "old-done"; created != wantNew {
			t.Errorf("%s: created = %v after Expire, want %v (key %s)", r.ActionID, created, wantNew, got.Key)
		}
	}
	// Years later, pending and unknown records are still there.
	now.Store(t0.Add(10 * 365 * 24 * time.Hour).UnixMilli())
	if n, err := j.Expire(ctx); err != nil || n != 3 {
		t.Fatalf("Expire years later: %d, %v; want the 3 done records", n, err)
	}
	got, err := j.Unfinished(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("Unfinished after expiry: %+v, %v; want old-pending and old-unknown", got, err)
	}
}

// The journal is told the key window and the grace, and keeps a done
// record for the two together: by default idemretry's key window and a day
// (journal.DefaultKeyWindow and journal.DefaultGrace, defined once).
func TestExpireKeyWindowAndGrace(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []sqljournal.Option
		kept time.Duration
	}{
		{"defaults", nil, 48 * time.Hour},
		{"a week's window", []sqljournal.Option{sqljournal.WithKeyWindow(7 * 24 * time.Hour)}, 8 * 24 * time.Hour},
		{"an hour's window, no grace", []sqljournal.Option{sqljournal.WithKeyWindow(time.Hour), sqljournal.WithGrace(0)}, time.Hour},
		{"the last option wins", []sqljournal.Option{sqljournal.WithGrace(0), sqljournal.WithKeyWindow(time.Hour),
			sqljournal.WithGrace(2 * time.Hour), sqljournal.WithKeyWindow(3 * time.Hour)}, 5 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]sqljournal.Option{sqljournal.WithClock(func() time.Time { return t0 })}, tc.opts...)
			j, _ := openJournal(t, db, opts...)
			mustReserve(t, j, rec("inside", "k1", -tc.kept+time.Millisecond, journal.StateDone), journal.ReuseAny, true)
			mustReserve(t, j, rec("edge", "k2", -tc.kept, journal.StateDone), journal.ReuseAny, true)
			mustReserve(t, j, rec("outside", "k3", -tc.kept-time.Millisecond, journal.StateDone), journal.ReuseAny, true)
			if n, err := j.Expire(ctx); err != nil || n != 1 {
				t.Fatalf("Expire: %d, %v; want 1 (the record older than %v)", n, err, tc.kept)
			}
			mustReserve(t, j, rec("edge", "new", 0, journal.StatePending), journal.ReuseAny, false)
			mustReserve(t, j, rec("outside", "new", 0, journal.StatePending), journal.ReuseAny, true)
			j.Close()
			if _, err := j.Expire(ctx); !errors.Is(err, journal.ErrClosed) {
				t.Fatalf("Expire after Close: %v", err)
			}
		})
	}
}
