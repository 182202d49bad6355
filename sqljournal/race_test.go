package sqljournal_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idemretry/idemretry/internal/hammer"
	"github.com/idemretry/idemretry/journal"
)

// raceReserve has n goroutines, spread round-robin over journals, reserve
// action id with a key of their own each, at once. It returns the keys they
// got and how many reported creating the record.
func raceReserve(t *testing.T, journals []journal.Journal, id string, n int, mode journal.ReserveMode) (map[string]int, int) {
	t.Helper()
	var (
		mu      sync.Mutex
		keys    = map[string]int{}
		created int
		wg      sync.WaitGroup
		start   = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := rec(id, fmt.Sprintf("key-%d", i), 0, journal.StatePending)
			got, c, err := journals[i%len(journals)].Reserve(context.Background(), r, mode)
			if err != nil {
				t.Errorf("Reserve %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			keys[got.Key]++
			if c {
				created++
			}
		}()
	}
	close(start)
	wg.Wait()
	return keys, created
}

func oneKey(t *testing.T, keys map[string]int, created, n int) {
	t.Helper()
	if len(keys) != 1 || created != 1 {
		t.Fatalf("%d reservers got %d keys %v, %d created; want 1 key, 1 created", n, len(keys), keys, created)
	}
}

func TestReserveManyGoroutinesOneKey(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	for _, mode := range []journal.ReserveMode{journal.ReuseAny, journal.ReusePending} {
		id := fmt.Sprintf("pay:mode-%d", mode)
		keys, created := raceReserve(t, []journal.Journal{j}, id, 100, mode)
		oneKey(t, keys, created, 100)
	}
}

// Two pools are two machines as far as the database can tell: separate
// connections, no shared memory.
func TestReserveTwoPoolsOneKey(t *testing.T) {
	jA, table := openJournal(t, testDB(t))
	jB := openOn(t, testDB(t), table)
	for a := range 20 {
		keys, created := raceReserve(t, []journal.Journal{jA, jB}, fmt.Sprintf("pay:%d", a), 40, journal.ReuseAny)
		oneKey(t, keys, created, 40)
	}
}

// A done action reserved by fingerprint from many places at once is
// replaced exactly once: the first replacement is pending, so every other
// reserver reuses it.
func TestReusePendingReplacesDoneOnce(t *testing.T) {
	jA, table := openJournal(t, testDB(t))
	jB := openOn(t, testDB(t), table)
	ctx := context.Background()
	old := rec("fp:x", "old-key", 0, journal.StatePending)
	mustReserve(t, jA, old, journal.ReusePending, true)
	old.State, old.Status = journal.StateDone, 200
	if err := jA.Update(ctx, old); err != nil {
		t.Fatal(err)
	}
	keys, created := raceReserve(t, []journal.Journal{jA, jB}, "fp:x", 100, journal.ReusePending)
	oneKey(t, keys, created, 100)
	if keys["old-key"] != 0 {
		t.Fatalf("the done record's key was reused: %v", keys)
	}
}

// Reserve, Update and Forget of one action racing each other never break
// the one-key rule for reservers that overlap a live record, and never
// fail.
func TestReserveForgetChurn(t *testing.T) {
	db := testDB(t)
	j, _ := openJournal(t, db)
	ctx := context.Background()
	hammer.Run(8, 50, func(i, n int) {
		r := rec("fp:churn", fmt.Sprintf("k-%d-%d", i, n), 0, journal.StatePending)
		got, _, err := j.Reserve(ctx, r, journal.ReusePending)
		if err != nil {
			t.Errorf("Reserve: %v", err)
			return
		}
		switch n % 3 {
		case 0:
			got.State = journal.StateDone
			_ = j.Update(ctx, got) // may have been forgotten: fine
		case 1:
			if err := j.Forget(ctx, got.ActionID); err != nil {
				t.Errorf("Forget: %v", err)
			}
		}
	})
}
