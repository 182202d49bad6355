package filejournal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of the write path, the committer: group commit (a Sync shares the
// next batch, and waits for the one in flight), a lazy Update arming the
// flush timer itself, the reused queue and frame buffers, the committer's
// yield, Close, and what an injected write or sync failure fails.

// countingFile counts the Syncs of the journal file.
type countingFile struct {
	file
	syncs *atomic.Int64
}

func (f countingFile) Sync() error {
	f.syncs.Add(1)
	return f.file.Sync()
}

// Group commit: while a batch is being written, the Reserves of new actions
// and the Syncs of other actions' "done" (what the Transport does for an
// unnamed action) all join the next batch, and that batch costs one sync:
// a Sync does not force an fdatasync of its own, it shares the Reserves'.
func TestSyncSharesTheNextBatch(t *testing.T) {
	t.Parallel()
	const k = 8
	var syncs atomic.Int64
	block, entered := make(chan struct{}), make(chan struct{}, 1)
	var armed atomic.Bool
	o := testOpts()
	o.hooks = &hooks{
		wrapFile: func(name string, f file) file {
			if name != journalName {
				return f
			}
			return countingFile{f, &syncs}
		},
		failpoint: func(name string) {
			if name == fpAfterWrite && armed.CompareAndSwap(true, false) {
				entered <- struct{}{}
				<-block
			}
		},
	}
	s, _ := mustOpen(t, t.TempDir(), o)
	defer s.Close()
	ctx := context.Background()
	var done []journal.Record
	for i := range k {
		done = append(done, reserve(t, s, entry(fmt.Sprintf("done-%d", i))))
	}
	armed.Store(true)
	go func() { _, _, _ = s.Reserve(ctx, entry("first"), journal.ReuseAny) }()
	<-entered // the first batch is written, its sync waits
	before := syncs.Load()

	var wg sync.WaitGroup
	errs := make(chan error, 2*k)
	for i := range k {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _, err := s.Reserve(ctx, entry(fmt.Sprintf("new-%d", i)), journal.ReuseAny)
			errs <- err
		}()
		go func() {
			defer wg.Done()
			r := done[i]
			r.State, r.Attempts, r.Status = journal.StateDone, 1, 201
			if err := s.Update(ctx, r); err != nil {
				errs <- err
				return
			}
			errs <- s.Sync(ctx)
		}()
	}
	// Every Reserve (a delete and an upsert) and every done is queued.
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.queue) == 3*k
	}, 10*time.Second, time.Millisecond)
	// A Sync that comes only after the next batch was taken waits for that
	// batch (or, once it is synced, returns at once): no sync of its own.
	close(block)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// The first batch's sync, then one for all the others.
	assert.Equal(t, int64(2), syncs.Load()-before, "syncs for the blocked batch and the one after it")
	for i := range k {
		got, ok, err := s.get(fmt.Sprintf("done-%d", i))
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, journal.StateDone, got.State)
	}
}

// A lazy Update arms the flush timer itself (the committer is not woken for
// it). One queued while the timer already runs, after a Reserve's batch
// took the update that armed it, is still written by that timer.
func TestLazyUpdateAfterBatchFlushedByTimer(t *testing.T) {
	t.Parallel()
	s, _ := openFlushing(t, 20*time.Millisecond)
	defer s.Close()
	a := reserve(t, s, entry("a"))
	require.NoError(t, update(s, "a", a.Key, journal.StatePending, 1, 0)) // arms the timer
	b := reserve(t, s, entry("b"))                                        // carries a's update
	before := s.stats().FileBytes
	require.NoError(t, update(s, "b", b.Key, journal.StateDone, 1, 200))
	require.Eventually(t, func() bool { return s.stats().FileBytes > before }, 5*time.Second, 5*time.Millisecond)
}

// Sync promises to wait until every update queued so far is durable. An
// update that a committing batch has already taken off the queue, but not
// yet synced, must be waited for too: the queue is empty then, yet the
// update is not durable. (Found in review: Sync returned at once.)
func TestSyncWaitsForBatchInFlight(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	armed := make(chan struct{})
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name != fpAfterWrite {
			return
		}
		select {
		case <-armed:
		default:
			return
		}
		select {
		case entered <- struct{}{}:
			<-block
		default:
		}
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	defer s.Close()
	a := reserve(t, s, entry("a"))
	require.NoError(t, update(s, a.ActionID, a.Key, journal.StateDone, 1, 201)) // lazy
	close(armed)
	// b's Reserve carries the update in its batch.
	go func() { _, _, _ = s.Reserve(context.Background(), entry("b"), journal.ReuseAny) }()
	<-entered // the batch holding a's update is written, not synced
	done := make(chan error, 1)
	go func() { done <- s.Sync(context.Background()) }()
	select {
	case err := <-done:
		close(block)
		t.Fatalf("Sync returned (%v) while the update was still unsynced", err)
	case <-time.After(200 * time.Millisecond):
		close(block)
		require.NoError(t, <-done)
	}
}

// Close writes every queued lazy update (whatever the flush interval), and
// Sync covers every update made before it, while many goroutines reserve,
// update, sync, forget and compact, the timer firing all along (-race).
func TestCommitterCloseAndSyncWriteEveryUpdate(t *testing.T) {
	t.Parallel()
	for _, flush := range []time.Duration{time.Nanosecond, 100 * time.Microsecond, time.Hour} {
		t.Run(flush.String(), func(t *testing.T) {
			dir := t.TempDir()
			o := testOpts()
			o.compactMin = 4096
			o.flushEvery = flush
			s, _ := mustOpen(t, dir, o)
			ctx := context.Background()
			const gs, per = 16, 60
			type last struct {
				key      string
				state    journal.State
				attempts int
				status   int
			}
			results := make([]map[string]last, gs)
			var wg sync.WaitGroup
			stop := inBackground(func() { // compactions and bare Syncs, racing the timer
				assert.NoError(t, s.Compact(ctx))
				assert.NoError(t, s.Sync(ctx))
				runtime.Gosched()
			})
			for g := range gs {
				wg.Add(1)
				results[g] = map[string]last{}
				go func() {
					defer wg.Done()
					for i := range per {
						id := fmt.Sprintf("g%d-%d", g, i)
						r, _, err := s.Reserve(ctx, entry(id), journal.ReuseAny)
						if !assert.NoError(t, err) {
							return
						}
						n := 1 + (g+i)%5
						for a := 1; a <= n; a++ {
							r.Attempts = a
							assert.NoError(t, s.Update(ctx, r))
						}
						if i%2 == 0 {
							r.State, r.Status = journal.StateDone, 200+i%50
							assert.NoError(t, s.Update(ctx, r))
						}
						if i%4 == 0 {
							assert.NoError(t, s.Sync(ctx))
						}
						results[g][id] = last{r.Key, r.State, r.Attempts, r.Status}
					}
				}()
			}
			wg.Wait()
			stop()
			require.NoError(t, s.Close())

			s2, _ := mustOpen(t, dir, testOpts())
			defer s2.Close()
			for g := range gs {
				for id, want := range results[g] {
					got, ok, err := s2.get(id)
					require.NoError(t, err)
					require.True(t, ok, "%s lost", id)
					assert.Equal(t, want.key, got.Key, id)
					assert.Equal(t, want.state, got.State, id)
					assert.Equal(t, want.attempts, got.Attempts, id)
					assert.Equal(t, want.status, got.Status, id)
				}
			}
		})
	}
}

// A lazy update with a long flush interval, and nothing else to write,
// must reach the disk by Close; and one made while a durable batch is
// being written (so it armed no timer: the committer is already busy)
// must reach it by the flush timer, with no Close.
func TestCommitterLazyUpdateWrittenByTimerAfterBusyBatch(t *testing.T) {
	t.Parallel()
	block, entered := make(chan struct{}), make(chan struct{}, 1)
	var armed atomic.Bool
	o := testOpts()
	o.flushEvery = 30 * time.Millisecond
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpAfterWrite && armed.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-block
		}
	}}
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	a := reserve(t, s, entry("a"))
	armed.Store(true)
	go func() { _, _, _ = s.Reserve(context.Background(), entry("b"), journal.ReuseAny) }()
	<-entered // b's batch is written, its sync held
	// A lazy update queued now: the timer it arms fires while the
	// committer is mid-batch.
	require.NoError(t, update(s, "a", a.Key, journal.StateDone, 1, 201))
	time.Sleep(3 * o.flushEvery)
	close(block)
	// Written by the timer, with no Sync, no Reserve and no Close.
	require.Eventually(t, func() bool {
		data, err := os.ReadFile(dir + "/journal")
		if err != nil {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.queue) == 0 && s.writing == nil && int64(len(data)) == s.sizeSeen
	}, 10*time.Second, 5*time.Millisecond)
	// Read it back from a copy of the file: the journal is still open.
	data, err := os.ReadFile(dir + "/journal")
	require.NoError(t, err)
	cp := t.TempDir()
	require.NoError(t, os.WriteFile(cp+"/journal", data, 0o600))
	s2, _ := mustOpen(t, cp, testOpts())
	got, ok, err := s2.get("a")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, journal.StateDone, got.State, "the lazy done written by the timer")
	require.NoError(t, s2.Close())
	require.NoError(t, s.Close())
}

// While an injected write or sync failure lasts, the journal acknowledges
// nothing begun after it showed (it acknowledged nothing more at all until
// issue 30, item 4: it had to be reopened); once the fault is gone, calls
// succeed again on the same Journal; and everything it acknowledged, before
// and after, is on disk after a reopen.
func TestCommitterFailureAcknowledgesNothingWhileItLasts(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"short", "sync"} {
		t.Run(fault, func(t *testing.T) {
			dir := t.TempDir()
			fail := new(sync.Map)
			o := testOpts()
			o.compactMin = 4096
			o.flushEvery = time.Millisecond
			o.hooks = faultyHooks(fail)
			s, _ := mustOpen(t, dir, o)
			ctx := context.Background()
			var mu sync.Mutex
			acked := map[string]string{}
			synced := map[string]bool{}
			start := time.Now()
			since := func() int64 { return int64(time.Since(start)) }
			// When the first error was seen, and when the fault's removal
			// began, in ns since start (0: not yet).
			var failedAt, healedAt atomic.Int64
			var lateAcks []string
			var okAfter atomic.Int64 // calls that succeeded once healed
			// acked reports whether err is nil, and notes an error, or an
			// acknowledgement of a call begun once the failure showed
			// that returned before the fault's removal began.
			ack := func(what string, begun int64, err error) bool {
				if err != nil {
					assert.ErrorIs(t, err, journal.ErrUnavailable)
					assert.NotErrorIs(t, err, journal.ErrClosed)
					failedAt.CompareAndSwap(0, since())
					return false
				}
				if f, h := failedAt.Load(), healedAt.Load(); f != 0 && begun > f && h == 0 {
					mu.Lock()
					lateAcks = append(lateAcks, what)
					mu.Unlock()
				}
				if healedAt.Load() != 0 {
					okAfter.Add(1)
				}
				return true
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						id := fmt.Sprintf("g%d-%d", g, i)
						b := since()
						r, _, err := s.Reserve(ctx, entry(id), journal.ReuseAny)
						if !ack("reserve "+id, b, err) {
							continue
						}
						mu.Lock()
						acked[id] = r.Key
						mu.Unlock()
						r.State, r.Attempts, r.Status = journal.StateDone, 1, 201
						require.NoError(t, s.Update(ctx, r), "a lazy update is queued, even while writes fail")
						b = since()
						if ack("sync "+id, b, s.Sync(ctx)) {
							mu.Lock()
							synced[id] = true
							mu.Unlock()
						}
					}
				}()
			}
			time.Sleep(time.Duration(20+rand.IntN(40)) * time.Millisecond)
			if fault == "short" {
				fail.Store("short:"+journalName, true)
			} else {
				fail.Store("sync", errors.New("injected fsync failure"))
			}
			for failedAt.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			healedAt.Store(since())
			if fault == "short" {
				fail.Delete("short:" + journalName)
			} else {
				fail.Delete("sync")
			}
			for okAfter.Load() < 50 {
				time.Sleep(time.Millisecond)
			}
			close(stop)
			wg.Wait()
			assert.Empty(t, lateAcks, "acknowledged while the journal failed")
			require.NoError(t, s.Close())

			s2, rep := mustOpen(t, dir, testOpts())
			defer s2.Close()
			assert.False(t, rep.TornTail, "a failed batch's frame was left in the file")
			for id, key := range acked {
				got, ok, err := s2.get(id)
				require.NoError(t, err)
				require.True(t, ok, "acknowledged %s lost", id)
				assert.Equal(t, key, got.Key, id)
				if synced[id] {
					assert.Equal(t, journal.StateDone, got.State, "%s's synced done", id)
				}
			}
			t.Logf("%d acknowledged, %d synced", len(acked), len(synced))
		})
	}
}

// Opening and closing journals with lazy updates queued and the flush
// timer running leaves no goroutine behind, whatever the interval.
func TestCommitterTimerLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	for i := range 30 {
		s, _ := openFlushing(t, []time.Duration{time.Nanosecond, time.Millisecond, time.Hour}[i%3])
		r := reserve(t, s, entry("a"))
		r.Attempts = 1
		require.NoError(t, s.Update(context.Background(), r))
		require.NoError(t, s.Close())
	}
	waitGoroutines(t, before)
}

// watchedFile fails its first Sync once failing is set (the first of all
// the journal's descriptors), and counts the writes and syncs asked of it
// after that failure.
type watchedFile struct {
	file
	failing *atomic.Bool
	failed  atomic.Bool // this descriptor's sync failed
	after   *atomic.Int64
}

func (f *watchedFile) Write(p []byte) (int, error) {
	if f.failed.Load() {
		f.after.Add(1)
	}
	return f.file.Write(p)
}

func (f *watchedFile) Sync() error {
	if f.failed.Load() {
		f.after.Add(1)
		return errors.New("sync after a failed sync")
	}
	if f.failing.CompareAndSwap(true, false) {
		f.failed.Store(true)
		return errors.New("injected fsync failure")
	}
	return f.file.Sync()
}

// After a failed fsync the journal writes and syncs that descriptor no
// more (its data may be lost whatever a later sync on it says), although
// lazy updates, Syncs, Reserves, the flush timer, compactions and Close
// keep coming: it goes on through a new descriptor.
func TestCommitterNoIOOnAFailedDescriptor(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	var after atomic.Int64
	o := testOpts()
	o.compactMin = 4096
	o.flushEvery = time.Nanosecond
	o.hooks = &hooks{wrapFile: func(name string, f file) file {
		if name != journalName {
			return f
		}
		return &watchedFile{file: f, failing: &failing, after: &after}
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	ctx := context.Background()
	var refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				r, _, err := s.Reserve(ctx, entry(fmt.Sprintf("g%d-%d", g, i)), journal.ReuseAny)
				if err != nil {
					assert.ErrorIs(t, err, journal.ErrUnavailable)
					refused.Add(1)
					continue
				}
				r.Attempts = 1
				_ = s.Update(ctx, r)
				_ = s.Sync(ctx)
				_ = s.Compact(ctx)
				if i == 20 && g == 0 {
					failing.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, failing.Load(), "the fault was never injected")
	require.NoError(t, s.Close())
	assert.Zero(t, after.Load(), "writes or syncs on the descriptor whose fsync failed")
	t.Logf("%d Reserves refused", refused.Load())
}

// openCopy opens a copy of dir's journal file as it is now (the journal
// itself stays open): what a crash at this moment would leave.
func openCopy(t *testing.T, dir string) *Journal {
	t.Helper()
	data, err := os.ReadFile(dir + "/" + journalName)
	require.NoError(t, err)
	cp := t.TempDir()
	require.NoError(t, os.WriteFile(cp+"/"+journalName, data, 0o600))
	s, _ := mustOpen(t, cp, testOpts())
	return s
}

// A batch of lazy updates larger than a frame's payload is written by Sync
// as several frames through the reused scratch buffers, and so are the
// smaller and larger batches after it: after each Sync, the file holds
// every update, byte for byte.
func TestCommitterHugeBatchesThroughReusedBuffers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("writes megabytes")
	}
	var syncs atomic.Int64
	o := testOpts()
	o.flushEvery = time.Hour
	o.hooks = &hooks{wrapFile: func(name string, f file) file {
		if name != journalName {
			return f
		}
		return countingFile{f, &syncs}
	}}
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	defer s.Close()
	ctx := context.Background()
	const n = 2600 // about 1.3 KB an upsert: 3.4 MB, four frames
	recs := make([]journal.Record, n)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 32 {
				e := entry(fmt.Sprintf("%04d-%s", i, strings.Repeat(string(rune('a'+i%26)), journal.MaxActionID-5)))
				e.Key = fmt.Sprintf("k%04d-%s", i, strings.Repeat("x", journal.MaxKeyLength-6))
				r, _, err := s.Reserve(ctx, e, journal.ReuseAny)
				assert.NoError(t, err)
				recs[i] = r
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	// Rounds of lazy updates, huge, small, huge, each then synced.
	counts := []int{n, 3, n, 1, n / 2}
	for round, count := range counts {
		for i := range count {
			r := recs[i]
			r.Attempts = round + 2
			require.NoError(t, s.Update(ctx, r))
		}
		before := syncs.Load()
		require.NoError(t, s.Sync(ctx))
		if count == n {
			require.GreaterOrEqual(t, syncs.Load()-before, int64(3), "round %d: a batch of several frames", round)
		}
		c := openCopy(t, dir)
		for i := range n {
			got, ok, err := c.get(recs[i].ActionID)
			require.NoError(t, err)
			require.True(t, ok, "round %d: %d lost", round, i)
			require.Equal(t, recs[i].Key, got.Key, "round %d: %d", round, i)
			want := 0 // the attempts of the latest round that updated it
			for rr, cc := range counts[:round+1] {
				if i < cc {
					want = rr + 2
				}
			}
			require.Equal(t, want, got.Attempts, "round %d: %d's attempts", round, i)
		}
		require.NoError(t, c.Close())
	}
}

// Every lazy update reaches the file by the flush timer alone (no Sync, no
// Reserve, no Close after it), even when updates keep arriving while the
// timer fires and while the committer writes the batch it fired for.
func TestCommitterTimerWritesEveryLazyUpdate(t *testing.T) {
	t.Parallel()
	for _, flush := range []time.Duration{time.Nanosecond, 50 * time.Microsecond, time.Millisecond} {
		t.Run(flush.String(), func(t *testing.T) {
			s, dir := openFlushing(t, flush)
			defer s.Close()
			const gs, per = 8, 300
			recs := reserveNumbered(t, s, "g", gs)
			raiseAttempts(s, recs, func(_, a int, err error) bool {
				assert.NoError(t, err)
				if a%16 == 0 {
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				}
				return a < per
			})()
			require.Eventually(t, func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.queue) == 0 && s.writing == nil
			}, 10*time.Second, time.Millisecond, "lazy updates still queued: the flush timer is not armed")
			c := openCopy(t, dir)
			defer c.Close()
			for g := range gs {
				got, ok, err := c.get(recs[g].ActionID)
				require.NoError(t, err)
				require.True(t, ok)
				assert.Equal(t, per, got.Attempts, "g%d's last update", g)
			}
		})
	}
}

// Close writes the lazy updates still queued, with nothing else to write
// them: the flush timer is an hour away, or fires while Close runs.
func TestCloseWritesQueuedLazyUpdates(t *testing.T) {
	t.Parallel()
	for _, flush := range []time.Duration{time.Hour, time.Nanosecond} {
		t.Run(flush.String(), func(t *testing.T) {
			s, dir := openFlushing(t, flush)
			recs := reserveNumbered(t, s, "a", 20)
			for i, r := range recs {
				r.State, r.Attempts, r.Status = journal.StateDone, 1, 200+i
				require.NoError(t, s.Update(context.Background(), r))
			}
			require.NoError(t, s.Close())
			s2, _ := mustOpen(t, dir, testOpts())
			defer s2.Close()
			for i, r := range recs {
				got, ok, err := s2.get(r.ActionID)
				require.NoError(t, err)
				require.True(t, ok)
				assert.Equal(t, journal.StateDone, got.State, r.ActionID)
				assert.Equal(t, 200+i, got.Status, r.ActionID)
			}
		})
	}
}

// Close racing lazy updates and the flush timer: every Update that
// returned nil before Close stopped the journal is on disk after it; the
// ones after it fail with ErrClosed.
func TestCloseRacingUpdatesAndTimer(t *testing.T) {
	t.Parallel()
	for _, flush := range []time.Duration{time.Nanosecond, 20 * time.Microsecond, time.Hour} {
		t.Run(flush.String(), func(t *testing.T) {
			for range 5 {
				s, dir := openFlushing(t, flush)
				const gs = 8
				recs := reserveNumbered(t, s, "g", gs)
				acked := make([]int, gs)
				wait := raiseAttempts(s, recs, func(g, a int, err error) bool {
					if err != nil {
						assert.ErrorIs(t, err, journal.ErrClosed)
						return false
					}
					acked[g] = a
					return true
				})
				time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
				require.NoError(t, s.Close())
				wait()
				s2, _ := mustOpen(t, dir, testOpts())
				for g := range gs {
					got, ok, err := s2.get(recs[g].ActionID)
					require.NoError(t, err)
					require.True(t, ok)
					require.Equal(t, acked[g], got.Attempts, "g%d: the last update acknowledged before Close", g)
				}
				require.NoError(t, s2.Close())
			}
		})
	}
}

// reserveNumbered reserves the actions prefix0 .. prefix<n-1>, in order.
func reserveNumbered(t *testing.T, s *Journal, prefix string, n int) []journal.Record {
	t.Helper()
	recs := make([]journal.Record, n)
	for i := range recs {
		recs[i] = reserve(t, s, entry(fmt.Sprintf("%s%d", prefix, i)))
	}
	return recs
}

// raiseAttempts starts one goroutine per record of recs, which updates it
// (a lazy Update) with attempts 1, 2, 3, ... and calls next(g, a, err)
// after each, g being the record's index, until next returns false; wait
// waits for them all.
func raiseAttempts(s *Journal, recs []journal.Record, next func(g, a int, err error) bool) (wait func()) {
	var wg sync.WaitGroup
	for g, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := 1; ; a++ {
				r.Attempts = a
				if !next(g, a, s.Update(context.Background(), r)) {
					return
				}
			}
		}()
	}
	return wg.Wait
}

// Tests of how the committer is woken (run): one channel, with what woke it
// in Journal.ev.

// An idle journal leaves its committer asleep: after a batch, the only
// wake-ups are the fingerprint.key check that batch armed (due a
// secretCheckEvery after the last) and, for a lazy update, the flush
// timer; nothing comes back every second. On a phone each wake-up is a
// CPU woken from sleep.
func TestIdleCommitterIsNotWokenAgainAndAgain(t *testing.T) {
	t.Parallel()
	var wakes atomic.Int64
	o := testOpts()
	o.flushEvery = 50 * time.Millisecond
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpWake {
			wakes.Add(1)
		}
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	defer s.Close()
	ctx := context.Background()
	e := entry("idle")
	_, _, err := s.Reserve(ctx, e, journal.ReuseAny)
	require.NoError(t, err)
	e.State, e.Status = journal.StateDone, 201
	require.NoError(t, s.Update(ctx, e)) // lazy: the flush timer writes it
	before := wakes.Load()
	idle := 4*secretCheckEvery + 500*time.Millisecond
	time.Sleep(idle)
	// One for the flush, one for the fingerprint.key check.
	require.LessOrEqual(t, wakes.Load()-before, int64(2),
		"the committer of a journal idle for %v was woken %d times", idle, wakes.Load()-before)
	got, found, err := s.get("idle")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, journal.StateDone, got.State)
}

// Compact calls and Close racing them: each Compact returns nil (done
// before the Journal stopped) or ErrClosed, none hangs, Close returns nil,
// and what was reserved before is in the reopened journal.
func TestCompactRacingCloseEndsEveryCall(t *testing.T) {
	t.Parallel()
	for round := 0; round < 20; round++ {
		dir := t.TempDir()
		s, _ := mustOpen(t, dir, testOpts())
		ids := reserveNumbered(t, s, "c", 8)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				errs <- s.Compact(ctx)
			}()
		}
		require.NoError(t, s.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				require.ErrorIs(t, err, journal.ErrClosed)
			}
		}
		s2, rep := mustOpen(t, dir, testOpts())
		require.Equal(t, len(ids), rep.Records)
		require.NoError(t, s2.Close())
	}
}

// A Compact whose context has ended does nothing and says so.
func TestCompactWithEndedContextDoesNothing(t *testing.T) {
	t.Parallel()
	var compactions atomic.Int64
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpCompactBegin {
			compactions.Add(1)
		}
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Compact(ctx), context.Canceled)
	require.NoError(t, s.Sync(context.Background()))
	require.Zero(t, compactions.Load())
	require.NoError(t, s.Compact(context.Background()))
	require.Equal(t, int64(1), compactions.Load())
}

// Every kind of work the committer is woken for, at once and at random:
// durable Reserves and Forgets, lazy Updates under a flush timer of a
// millisecond or two, Syncs, Compacts (some with contexts that end), the
// expiry timer every millisecond, and Close at a random moment. No call
// hangs (a lost wake-up would leave a Reserve, Sync, Compact or Close
// waiting for ever), every call returns nil or ErrClosed, and the reopened
// journal holds everything that was acknowledged: each Reserve, each
// Forget, and each Update that a later Sync covered.
func TestCommitterUnderEveryWakeAtOnce(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
func TestCommitterIdleJournalExpiresByItsTimerAlone(t *testing.T) {
	t.Parallel()
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
