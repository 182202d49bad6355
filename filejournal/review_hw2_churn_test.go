package filejournal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// The concurrency part of hW2's review of the file journal: Reserve,
// Update, Sync and Forget at high concurrency, with compactions and expiry
// running all the time, against a per-id model.

// hw2Model is what an id's owner knows of its record.
type hw2Model struct {
	state    journal.State // 0: none
	key      string
	created  int64 // the record's CreatedAt, Unix ms (of the fake clock)
	attempts int
	hist     []string // what the owner did, for failure messages
}

// TestHW2ChurnWithExpiryAndCompaction: 16 goroutines, each owning 4 ids,
// cycle them through Reserve (ReusePending, a fresh key each time),
// in-place Updates, a lazy or synced done, Gets and Forgets, while a fake
// clock runs 2 ms a call (retention 300 ms: done records expire by the
// clock and by the observed time as the run goes), the committer looks for
// expired records every millisecond and compacts past 4 KiB. After every
// call the owner checks what it must see: a pending record is there with
// its key (Reserve gives it back, never a new key); a done one is there,
// done, with its key and attempts, or absent only once its retention is
// over; a forgotten one is absent; an Update of a record the owner holds
// succeeds. Then the journal is closed and reopened, and checked the same
// way.
func TestHW2ChurnWithExpiryAndCompaction(t *testing.T) {
	const workers, idsEach, steps = 16, 4, 1000
	var clock atomic.Int64
	clock.Store(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	now := func() time.Time { return time.UnixMilli(clock.Add(2)) }
	o := testOpts()
	o.now, o.keyWindow, o.grace, o.retention = now, 300*time.Millisecond, 0, 300*time.Millisecond
	o.expiryEvery, o.compactMin, o.flushEvery = time.Millisecond, 4<<10, 2*time.Millisecond
	var compactions atomic.Int64
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpDirSynced {
			compactions.Add(1)
		}
	}}
	dir := t.TempDir()
	j, _ := mustOpen(t, dir, o)
	ctx := context.Background()
	ret := o.retention.Milliseconds()
	models := make([][]hw2Model, workers)

	// check compares what the journal has of id with m. A retention is
	// judged over by the clock after the Get: the Get judged it no later.
	check := func(j *Journal, id string, m hw2Model, what string) error {
		got, ok, err := j.Get(ctx, id)
		after := clock.Load()
		if err != nil {
			return fmt.Errorf("%s: get %s: %w", what, id, err)
		}
		switch {
		case m.state == 0 && ok:
			return fmt.Errorf("%s: %s is there (key %s, %v), forgotten or never made", what, id, got.Key, got.State)
		case m.state == 0:
			return nil
		case !ok && m.state == journal.StateDone && after-m.created > ret:
			return nil // expired
		case !ok:
			return fmt.Errorf("%s: %s (%v, key %s, made %d ms ago) lost; history %v", what, id, m.state, m.key, after-m.created, m.hist)
		case got.Key != m.key:
			return fmt.Errorf("%s: %s has key %s, want %s", what, id, got.Key, m.key)
		case m.state == journal.StateDone && got.State != journal.StateDone:
			return fmt.Errorf("%s: %s's done came back as %v", what, id, got.State)
		case got.Attempts < m.attempts:
			return fmt.Errorf("%s: %s has %d attempts, want at least %d", what, id, got.Attempts, m.attempts)
		}
		return nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := range workers {
		models[g] = make([]hw2Model, idsEach)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 12))
			ms := models[g]
			fail := func(err error) { errs <- fmt.Errorf("worker %d: %w", g, err) }
			for s := range steps {
				i := rng.IntN(idsEach)
				id := fmt.Sprintf("w%d-%d", g, i)
				m := &ms[i]
				say := func(f string, a ...any) {
					m.hist = append(m.hist, fmt.Sprintf("@%d ", clock.Load())+fmt.Sprintf(f, a...))
				}
				switch op := rng.IntN(10); {
				case op < 4: // Reserve
					e := entry(id)
					e.CreatedAt = time.UnixMilli(clock.Load())
					got, created, err := j.Reserve(ctx, e, journal.ReusePending)
					if err != nil {
						fail(err)
						return
					}
					if m.state == journal.StatePending {
						if created || got.Key != m.key {
							fail(fmt.Errorf("step %d: Reserve of pending %s (key %s) gave key %s, created %v", s, id, m.key, got.Key, created))
							return
						}
						break
					}
					if !created || got.Key != e.Key {
						fail(fmt.Errorf("step %d: Reserve of %s (model %v) did not create it: key %s, created %v", s, id, m.state, got.Key, created))
						return
					}
					*m = hw2Model{state: journal.StatePending, key: got.Key, created: e.CreatedAt.UnixMilli(), hist: m.hist}
					say("reserved %s", got.Key[:8])
				case op < 6 && m.state == journal.StatePending: // attempts
					m.attempts += 1 + rng.IntN(200)
					if err := update(j, id, m.key, journal.StatePending, uint32(m.attempts), 0); err != nil {
						fail(fmt.Errorf("step %d: update %s: %w", s, id, err))
						return
					}
				case op < 8 && m.state == journal.StatePending: // done, synced or not
					m.attempts++
					if err := update(j, id, m.key, journal.StateDone, uint32(m.attempts), 201); err != nil {
						fail(fmt.Errorf("step %d: done %s: %w", s, id, err))
						return
					}
					m.state = journal.StateDone
					say("done")
					if rng.IntN(2) == 0 {
						if err := j.Sync(ctx); err != nil {
							fail(err)
							return
						}
					}
				case op == 8 && m.state != 0:
					if err := j.Forget(ctx, id); err != nil {
						fail(err)
						return
					}
					*m = hw2Model{hist: m.hist}
					say("forgotten")
				}
				if err := check(j, id, *m, fmt.Sprintf("step %d", s)); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := j.stats()
	require.NoError(t, j.Close())
	// Open made the journal with a compaction's steps; the run made more.
	require.Greater(t, compactions.Load(), int64(5), "compactions during the run")
	j, rep := mustOpen(t, dir, o)
	defer j.Close()
	for g, ms := range models {
		for i, m := range ms {
			require.NoError(t, check(j, fmt.Sprintf("w%d-%d", g, i), m, "after reopen"))
		}
	}
	require.NoError(t, reviewCheckIndex(j))
	t.Logf("%d compactions; before close: %+v; reopened: %d records, compacted %v", compactions.Load(), st, rep.Records, rep.Compacted)
}
