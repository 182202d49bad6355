package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// currentDDL is the table as Open creates it now: legacyDDL's columns and
// the lease columns, for tables made by hand.
var currentDDL = strings.Replace(legacyDDL, "status      integer  NOT NULL",
	"status      integer  NOT NULL,\n\tlease_holder text,\n\tlease_until  timestamptz", 1)

// leaseOf returns the lease columns of id's row: holder ("" for none) and
// the time left on the database's clock.
func leaseOf(t *testing.T, db *sql.DB, table, storedID string) (string, time.Duration) {
	t.Helper()
	var (
		holder *string
		leftMs *int64
	)
	if err := db.QueryRow(`SELECT lease_holder, (extract(epoch FROM lease_until - now()) * 1000)::bigint FROM "`+table+`" WHERE action_id = $1`,
		storedID).Scan(&holder, &leftMs); err != nil {
		t.Fatal(err)
	}
	if holder == nil {
		return "", 0
	}
	return *holder, time.Duration(*leftMs) * time.Millisecond
}

func mustLease(t *testing.T, j journal.Leaser, id, holder string, ttl time.Duration) (bool, time.Time) {
	t.Helper()
	held, until, err := j.Lease(context.Background(), id, holder, ttl)
	if err != nil {
		t.Fatalf("Lease(%s, %s): %v", id, holder, err)
	}
	return held, until
}

// One holder at a time: taken, renewed by its holder, refused to another
// until it ends (and then taken over), released by its holder only.
func TestLeaseTakeRenewRefuseRelease(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)

	before := time.Now()
	held, until := mustLease(t, j, "pay:1", "machine-a", time.Hour)
	if !held || until.Before(before.Add(time.Hour)) || until.After(time.Now().Add(time.Hour)) {
		t.Fatalf("first Lease: held %v until %v, want held, an hour from the call", held, until)
	}
	if h, left := leaseOf(t, db, table, "pay:1"); h != "machine-a" || left <= 59*time.Minute || left > time.Hour {
		t.Fatalf("row: holder %q, %v left; want machine-a, about an hour", h, left)
	}
	// Another holder is refused, and told when the lease ends.
	held, until = mustLease(t, j, "pay:1", "machine-b", time.Minute)
	if held || until.Before(time.Now().Add(59*time.Minute)) || until.After(time.Now().Add(time.Hour)) {
		t.Fatalf("Lease by another holder: held %v until %v, want refused, about an hour from now", held, until)
	}
	if h, _ := leaseOf(t, db, table, "pay:1"); h != "machine-a" {
		t.Fatalf("a refused Lease changed the holder to %q", h)
	}
	// Its holder renews it, for the ttl it gives now.
	if held, _ := mustLease(t, j, "pay:1", "machine-a", 10*time.Minute); !held {
		t.Fatal("renewal by the holder refused")
	}
	if _, left := leaseOf(t, db, table, "pay:1"); left > 10*time.Minute || left < 9*time.Minute {
		t.Fatalf("after renewal for 10 minutes: %v left", left)
	}
	// Release by another holder changes nothing.
	if err := j.Release(ctx, "pay:1", "machine-b"); err != nil {
		t.Fatalf("Release by a holder without the lease: %v", err)
	}
	if held, _ := mustLease(t, j, "pay:1", "machine-b", time.Minute); held {
		t.Fatal("another holder's Release ended the lease")
	}
	// Release by its holder frees it for anyone.
	if err := j.Release(ctx, "pay:1", "machine-a"); err != nil {
		t.Fatal(err)
	}
	if h, _ := leaseOf(t, db, table, "pay:1"); h != "" {
		t.Fatalf("after Release: holder %q", h)
	}
	if held, _ := mustLease(t, j, "pay:1", "machine-b", time.Minute); !held {
		t.Fatal("a released lease was refused")
	}
	// Releasing twice, or a lease never taken, is not an error.
	for _, h := range []string{"machine-a", "machine-b", "machine-b"} {
		if err := j.Release(ctx, "pay:1", h); err != nil {
			t.Fatalf("Release(%s): %v", h, err)
		}
	}
	// The lease columns leave the record alone.
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	sameRecord(t, "record after leases", got, rec("pay:1", "k1", 0, journal.StatePending))
}

// A lease whose holder stopped renewing it (a machine died) is taken over
// once it ends on the database's clock, and not before; the old holder's
// renewal is then refused and its Release does not end the new lease.
func TestLeaseTakeoverAfterExpiry(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	other := openOn(t, testDB(t), table) // another machine: its own pool
	ctx := context.Background()
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)

	const ttl = 300 * time.Millisecond
	if held, _ := mustLease(t, j, "pay:1", "dead", ttl); !held {
		t.Fatal("Lease refused")
	}
	held, until := mustLease(t, other, "pay:1", "alive", time.Minute)
	if held {
		t.Fatal("the lease was taken over before it ended")
	}
	time.Sleep(time.Until(until) + 10*time.Millisecond)
	if held, _ := mustLease(t, other, "pay:1", "alive", time.Minute); !held {
		t.Fatalf("the lease was not taken over once it ended (told it ends at %v)", until)
	}
	if held, _ := mustLease(t, j, "pay:1", "dead", ttl); held {
		t.Fatal("the old holder renewed a lease taken over")
	}
	if err := j.Release(ctx, "pay:1", "dead"); err != nil {
		t.Fatal(err)
	}
	if held, _ := mustLease(t, j, "pay:1", "third", time.Minute); held {
		t.Fatal("the old holder's Release ended the new holder's lease")
	}
}

// Of many holders on many pools asking for a free lease at once, exactly
// one gets it.
func TestLeaseConcurrentTakers(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	journals := []*sqljournal.Journal{j, openOn(t, testDB(t), table), openOn(t, testDB(t), table)}
	for round := range 5 {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			holders []string
		)
		for i := range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := fmt.Sprintf("r%d-h%d", round, i)
				held, _, err := journals[i%len(journals)].Lease(context.Background(), "pay:1", h, time.Minute)
				if err != nil {
					t.Errorf("Lease: %v", err)
				}
				if held {
					mu.Lock()
					holders = append(holders, h)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(holders) != 1 {
			t.Fatalf("round %d: held by %v, want exactly one holder", round, holders)
		}
		if h, _ := leaseOf(t, db, table, "pay:1"); h != holders[0] {
			t.Fatalf("round %d: row says %q, the winner was %q", round, h, holders[0])
		}
		if err := j.Release(context.Background(), "pay:1", holders[0]); err != nil {
			t.Fatal(err)
		}
	}
}

// With hashed ids the lease is on the digest's row, and the id as given
// and its digest form (as Unfinished returns it) name the same lease.
func TestLeaseHashedIDs(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db, sqljournal.WithHashedActionIDs())
	mustReserve(t, j, rec("pay:customer-42", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	digest := journal.Digest("pay:customer-42")
	if held, _ := mustLease(t, j, "pay:customer-42", "machine-a", time.Minute); !held {
		t.Fatal("Lease refused")
	}
	if h, _ := leaseOf(t, db, table, digest); h != "machine-a" {
		t.Fatalf("digest row's holder %q, want machine-a", h)
	}
	if held, _ := mustLease(t, j, digest, "machine-b", time.Minute); held {
		t.Fatal("the digest form leased the action again to another holder")
	}
	if held, _ := mustLease(t, j, digest, "machine-a", time.Minute); !held {
		t.Fatal("the holder could not renew by the digest form")
	}
	if err := j.Release(context.Background(), digest, "machine-a"); err != nil {
		t.Fatal(err)
	}
	if held, _ := mustLease(t, j, "pay:customer-42", "machine-b", time.Minute); !held {
		t.Fatal("Release by the digest form left the lease held")
	}
}

// A lease needs a record; bad arguments are refused with typed errors and
// touch nothing; a closed journal says so.
func TestLeaseRefusals(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	ctx := context.Background()
	if _, _, err := j.Lease(ctx, "pay:none", "h", time.Minute); !errors.Is(err, journal.ErrNotFound) {
		t.Errorf("Lease of an action without a record: %v, want journal.ErrNotFound", err)
	}
	if err := j.Release(ctx, "pay:none", "h"); err != nil {
		t.Errorf("Release of an action without a record: %v, want nil", err)
	}
	mustReserve(t, j, rec("pay:1", "k1", 0, journal.StatePending), journal.ReuseAny, true)
	for _, tc := range []struct {
		name, id, holder string
		ttl              time.Duration
	}{
		{"empty id", "", "h", time.Minute},
		{"NUL in id", "pay:\x00", "h", time.Minute},
		{"id too long", strings.Repeat("x", journal.MaxActionID+1), "h", time.Minute},
		{"empty holder", "pay:1", "", time.Minute},
		{"holder with a space", "pay:1", "machine a", time.Minute},
		{"holder too long", "pay:1", strings.Repeat("h", journal.MaxKeyLength+1), time.Minute},
		{"zero ttl", "pay:1", "h", 0},
		{"negative ttl", "pay:1", "h", -time.Second},
		{"ttl under a millisecond", "pay:1", "h", time.Microsecond},
	} {
		_, _, err := j.Lease(ctx, tc.id, tc.holder, tc.ttl)
		if !errors.Is(err, journal.ErrInvalidRecord) || strings.Count(err.Error(), "idemretry: ") != 1 {
			t.Errorf("Lease with %s: %v, want journal.ErrInvalidRecord with the prefix once", tc.name, err)
		}
		if tc.ttl == time.Minute { // a bad id or holder
			if err := j.Release(ctx, tc.id, tc.holder); !errors.Is(err, journal.ErrInvalidRecord) {
				t.Errorf("Release with %s: %v, want journal.ErrInvalidRecord", tc.name, err)
			}
		}
	}
	if h, _ := leaseOf(t, db, table, "pay:1"); h != "" {
		t.Fatalf("refused calls left holder %q", h)
	}
	// Forget takes the lease with the record.
	mustLease(t, j, "pay:1", "h", time.Minute)
	if err := j.Forget(ctx, "pay:1"); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, true)
	if held, _ := mustLease(t, j, "pay:1", "other", time.Minute); !held {
		t.Fatal("a forgotten action's lease outlived its record")
	}
	j.Close()
	if _, _, err := j.Lease(ctx, "pay:1", "h", time.Minute); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("Lease after Close: %v, want journal.ErrClosed", err)
	}
	if err := j.Release(ctx, "pay:1", "h"); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("Release after Close: %v, want journal.ErrClosed", err)
	}
}

// A table made before leases (by an earlier version, or by hand from the
// old documentation) is refused WithoutCreateTable, with what to run; an
// Open that may create tables adds the columns, keeping the records.
func TestLeaseColumnsOnOlderTable(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	table := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + table + `" ` + legacyDDL); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO "`+table+`" VALUES ('pay:1', 'k1', $1, 0, 1, 0, 0)`, make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable())
	t.Logf("Open WithoutCreateTable of a table without lease columns: %v", err)
	if !errors.Is(err, journal.ErrIncompatible) || !strings.Contains(err.Error(), "ADD COLUMN lease_holder") ||
		strings.Count(err.Error(), "idemretry: ") != 1 {
		t.Fatalf("Open WithoutCreateTable of a table without lease columns: %v, want journal.ErrIncompatible saying what to run", err)
	}
	j := openOn(t, db, table)
	if held, _ := mustLease(t, j, "pay:1", "h", time.Minute); !held {
		t.Fatal("Lease on the upgraded table refused")
	}
	got := mustReserve(t, j, rec("pay:1", "k2", 0, journal.StatePending), journal.ReuseAny, false)
	if got.Key != "k1" {
		t.Fatalf("the upgrade lost the record: key %q", got.Key)
	}
	if _, err := sqljournal.Open(ctx, db, sqljournal.WithTable(table), sqljournal.WithoutCreateTable()); err != nil {
		t.Fatalf("Open WithoutCreateTable after the upgrade: %v", err)
	}
	// Lease columns of other types are refused, whoever made them.
	bad := newTable(t, db)
	if _, err := db.Exec(`CREATE TABLE "` + bad + `" ` + strings.Replace(currentDDL, "timestamptz", "bigint", 1)); err != nil {
		t.Fatal(err)
	}
	for _, extra := range []sqljournal.Option{nil, sqljournal.WithoutCreateTable()} {
		_, err := sqljournal.Open(ctx, db, sqljournal.WithTable(bad), extra)
		t.Logf("lease_until of type bigint: %v", err)
		if !errors.Is(err, journal.ErrIncompatible) {
			t.Errorf("Open of a table whose lease_until is a bigint: %v, want journal.ErrIncompatible", err)
		}
	}
}
