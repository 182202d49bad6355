package sqljournal_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry/sqljournal"
)

func sqljournalHashed() sqljournal.Option { return sqljournal.WithHashedActionIDs() }

func TestHashedActionIDs(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db, sqljournal.WithHashedActionIDs())
	ctx := context.Background()
	const id = "pay:customer-42"
	r := rec(id, "k1", 0, journal.StatePending)
	if got := mustReserve(t, j, r, journal.ReuseAny, true); got.ActionID != id {
		t.Fatalf("Reserve returned id %q, want the caller's", got.ActionID)
	}
	sum := sha256.Sum256([]byte(id))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	var stored string
	if err := db.QueryRowContext(ctx, `SELECT action_id FROM "`+table+`"`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != digest {
		t.Fatalf("stored id %q, want %q", stored, digest)
	}
	if got := mustReserve(t, j, rec(id, "k2", 0, journal.StatePending), journal.ReuseAny, false); got.Key != "k1" || got.ActionID != id {
		t.Fatalf("second Reserve: %+v", got)
	}
	un, err := j.Unfinished(ctx)
	if err != nil || len(un) != 1 || un[0].ActionID != digest {
		t.Fatalf("Unfinished: %+v, %v; want one record with the digest as id", un, err)
	}
	// What Unfinished returns is what Forget takes.
	if err := j.Forget(ctx, un[0].ActionID); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, j, r, journal.ReuseAny, true)
	if err := j.Forget(ctx, id); err != nil {
		t.Fatal(err)
	}
	if un, _ := j.Unfinished(ctx); len(un) != 0 {
		t.Fatalf("Forget by the caller's id left %+v", un)
	}
}
