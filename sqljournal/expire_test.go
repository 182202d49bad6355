package sqljournal_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/sqljournal"
)

func TestExpireDropsOnlyOldDone(t *testing.T) {
	db := testDB(t)
	var now atomic.Int64
	now.Store(t0.UnixMilli())
	j, _ := openJournal(t, db, sqljournal.WithRetention(48*time.Hour),
		sqljournal.WithNow(func() time.Time { return time.UnixMilli(now.Load()) }))
	ctx := context.Background()
	records := []journal.Record{
		rec("old-done", "k1", -72*time.Hour, journal.StateDone),
		rec("old-pending", "k2", -72*time.Hour, journal.StatePending),
		rec("old-unknown", "k3", -72*time.Hour, journal.StateUnknown),
		rec("new-done", "k4", -time.Hour, journal.StateDone),
		rec("edge-done", "k5", -48*time.Hour, journal.StateDone), // exactly the retention: kept
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

func TestExpireDefaultRetention(t *testing.T) {
	if want := idemretry.DefaultKeyWindow + 24*time.Hour; sqljournal.DefaultRetention != want {
		t.Fatalf("DefaultRetention = %v, want %v", sqljournal.DefaultRetention, want)
	}
	db := testDB(t)
	j, _ := openJournal(t, db, sqljournal.WithNow(func() time.Time { return t0 }))
	ctx := context.Background()
	mustReserve(t, j, rec("inside", "k1", -sqljournal.DefaultRetention+time.Minute, journal.StateDone), journal.ReuseAny, true)
	mustReserve(t, j, rec("outside", "k2", -sqljournal.DefaultRetention-time.Minute, journal.StateDone), journal.ReuseAny, true)
	if n, err := j.Expire(ctx); err != nil || n != 1 {
		t.Fatalf("Expire: %d, %v; want 1", n, err)
	}
	j.Close()
	if _, err := j.Expire(ctx); !errors.Is(err, journal.ErrClosed) {
		t.Fatalf("Expire after Close: %v", err)
	}
}
