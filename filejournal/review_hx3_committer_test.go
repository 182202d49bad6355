package filejournal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Every kind of work the committer is woken for, at once and at random:
// durable Reserves and Forgets, lazy Updates under a flush timer of a
// millisecond or two, Syncs, Compacts (some with contexts that end), the
// expiry timer every millisecond, and Close at a random moment. No call
// hangs (a lost wake-up would leave a Reserve, Sync, Compact or Close
// waiting for ever), every call returns nil or ErrClosed, and the reopened
// journal holds everything that was acknowledged: each Reserve, each
// Forget, and each Update that a later Sync covered.
func TestReviewHX3CommitterUnderEveryWakeAtOnce(t *testing.T) {
	rounds := 25
	if testing.Short() {
		rounds = 5
	}
	for round := range rounds {
		dir := t.TempDir()
		o := testOpts()
		o.flushEvery = time.Duration(1+rand.IntN(2)) * time.Millisecond
		o.expiryEvery = time.Millisecond
		s, _ := mustOpen(t, dir, o)

		type want struct {
			reserved, forgotten, synced bool
		}
		var mu sync.Mutex
		acked := map[string]*want{}
		var bad []error
		check := func(what string, err error) bool {
			if err == nil {
				return true
			}
			if !errors.Is(err, journal.ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
				mu.Lock()
				bad = append(bad, fmt.Errorf("%s: %w", what, err))
				mu.Unlock()
			}
			return false
		}
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				var updated []string
				for i := 0; ; i++ {
					id := fmt.Sprintf("g%d-%d", g, i)
					e := entry(id)
					if _, _, err := s.Reserve(ctx, e, journal.ReuseAny); !check("reserve", err) {
						return
					}
					mu.Lock()
					acked[id] = &want{reserved: true}
					mu.Unlock()
					switch rand.IntN(5) {
					case 0:
						if !check("forget", s.Forget(ctx, id)) {
							return
						}
						mu.Lock()
						acked[id].forgotten = true
						mu.Unlock()
					case 1, 2:
						e.State, e.Status = journal.StateDone, 200
						if !check("update", s.Update(ctx, e)) {
							return
						}
						updated = append(updated, id)
					case 3:
						if !check("sync", s.Sync(ctx)) {
							return
						}
						mu.Lock()
						for _, u := range updated {
							acked[u].synced = true
						}
						mu.Unlock()
						updated = updated[:0]
					case 4:
						cctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3))*time.Millisecond)
						err := s.Compact(cctx)
						cancel()
						if err != nil && !errors.Is(err, context.DeadlineExceeded) && !check("compact", err) {
							return
						}
					}
				}
			}()
		}
		time.Sleep(time.Duration(5+rand.IntN(40)) * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case err := <-closed:
			if err != nil {
				t.Fatalf("round %d: Close: %v", round, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Close did not return within 30s", round)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: calls still waiting 30s after Close returned", round)
		}
		if len(bad) > 0 {
			t.Fatalf("round %d: %v", round, bad)
		}
		s2, _ := mustOpen(t, dir, testOpts())
		for id, w := range acked {
			got, found, err := s2.get(id)
			if err != nil {
				t.Fatalf("round %d: get %s: %v", round, id, err)
			}
			switch {
			case w.forgotten && found:
				t.Errorf("round %d: %s forgotten (acknowledged) but in the reopened journal", round, id)
			case !w.forgotten && !found:
				t.Errorf("round %d: %s reserved (acknowledged) but not in the reopened journal", round, id)
			case w.synced && got.State != journal.StateDone:
				t.Errorf("round %d: %s updated done and synced, reopened as %v", round, id, got.State)
			}
		}
		if err := s2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A Compact asked for while a batch's sync fails runs once that batch is
// undone, and rewrites the journal from memory, without the record the
// failed batch was refused (it failed with journal.ErrClosed when a failure
// stopped the Journal: found in review hx3); a Reserve is refused while the
// journal's syncs still fail, and once they work, the same Journal goes on.
func TestCompactBehindAFailedBatchLeavesItOut(t *testing.T) {
	fail := &sync.Map{}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var armed atomic.Bool
	o := testOpts()
	o.hooks = &hooks{
		wrapFile: func(name string, f file) file {
			if name != journalName {
				return f
			}
			return &faultyFile{file: f, fail: fail, name: name}
		},
		failpoint: func(name string) {
			if name == fpAfterWrite && armed.Load() {
				once.Do(func() { close(entered); <-release })
			}
		},
	}
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	ctx := context.Background()
	a := reserve(t, s, entry("a"))
	fail.Store("sync", errNoSpace)
	armed.Store(true)
	reserved := make(chan error, 1)
	go func() { _, _, err := s.Reserve(ctx, entry("refused"), journal.ReuseAny); reserved <- err }()
	<-entered // the Reserve's batch is written; its sync will fail
	compacted := make(chan error, 1)
	go func() { compacted <- s.Compact(ctx) }()
	for queued := false; !queued; time.Sleep(time.Millisecond) { // the Compact waits for the committer
		s.mu.Lock()
		queued = len(s.ev.compact) == 1
		s.mu.Unlock()
	}
	close(release)
	if err := <-reserved; !errors.Is(err, journal.ErrUnavailable) || !errors.Is(err, errNoSpace) {
		t.Fatalf("Reserve whose sync failed: %v, want ErrUnavailable and the sync's error", err)
	}
	if err := <-compacted; err != nil {
		t.Errorf("Compact queued behind the failed batch: %v", err)
	}
	if _, _, err := s.Reserve(ctx, entry("b"), journal.ReuseAny); !errors.Is(err, journal.ErrUnavailable) || !errors.Is(err, errNoSpace) {
		t.Errorf("Reserve while syncs fail: %v, want ErrUnavailable and the sync's error", err)
	}
	fail.Delete("sync")
	b := reserve(t, s, entry("b"))
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	for _, want := range []journal.Record{a, b} {
		got, found, _ := s.get(want.ActionID)
		if !found || got.Key != want.Key {
			t.Errorf("%s: %v, found %v; want key %s", want.ActionID, got, found, want.Key)
		}
	}
	if _, found, _ := s.get("refused"); found {
		t.Error("the refused Reserve is in the file")
	}
}

// An idle journal still drops its expired records: the expiry timer, the
// only thing that wakes its committer then, fires again and again (it is
// re-armed after each look) until a done record's retention is over by both
// the clock and the observed time, and then compacts it away, with no call
// on the Journal meanwhile.
func TestReviewHX3IdleJournalExpiresByItsTimerAlone(t *testing.T) {
	var compactions atomic.Int64
	o := testOpts()
	base := time.Now()
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	o.now = func() time.Time { return start.Add(time.Since(base) * 100) } // 100 times fast
	o.keyWindow, o.grace = 2*time.Second, time.Second
	o.expiryEvery = 5 * time.Millisecond
	require.NoError(t, o.check())
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpCompactBegin {
			compactions.Add(1)
		}
	}}
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	ctx := context.Background()
	e := entry("expiring")
	e.CreatedAt = time.UnixMilli(o.now().UnixMilli())
	got := reserve(t, s, e)
	got.State, got.Status = journal.StateDone, 201
	require.NoError(t, s.Update(ctx, got))
	require.NoError(t, s.Sync(ctx))
	before := compactions.Load()
	deadline := time.Now().Add(20 * time.Second)
	for compactions.Load() == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.Greater(t, compactions.Load(), before, "no compaction of the expired record within 20s of real time (%v of the journal's)", o.now().Sub(e.CreatedAt))
	require.NoError(t, s.Close())
	s2, rep := mustOpen(t, dir, testOpts())
	defer s2.Close()
	require.Zero(t, rep.Records, "the expired record is still in the file")
}
