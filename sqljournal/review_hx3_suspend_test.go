package sqljournal_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// A machine suspended for ten minutes since Open (a laptop closed): its
// monotonic clock stood still, so the database's time Now extrapolates from
// Open's reading is ten minutes behind. Now is what a Transport on a
// machine whose clock runs behind judges key windows by; behind, it would
// take keys for younger than they are and send them after their window.
// The next Reserve, before which no key of the record it returns is judged,
// reads the database's clock again: created or found, Now is then not
// behind the database's clock.
func TestReviewHX3NowCatchesUpAfterASuspendAtTheNextReserve(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	ctx := context.Background()
	readDB := func() time.Time { return dbClockNow(t, db) }
	for _, created := range []bool{true, false} {
		sqljournal.SuspendedFor(j, 10*time.Minute)
		if behind := readDB().Sub(j.Now()); behind < 9*time.Minute {
			t.Fatalf("after the suspend, Now is %v behind the database's clock, want about 10m", behind)
		}
		r := rec("pay:suspended", "k-suspended", 0, journal.StatePending)
		if _, got, err := j.Reserve(ctx, r, journal.ReuseAny); err != nil || got != created {
			t.Fatalf("Reserve: created %v, %v; want created %v", got, err, created)
		}
		if db, now := readDB(), j.Now(); now.Before(db.Add(-time.Second)) {
			t.Errorf("after a Reserve (created %v), Now %v is %v behind the database's clock %v", created, now, db.Sub(now), db)
		}
	}
}
