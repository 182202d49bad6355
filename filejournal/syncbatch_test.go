package filejournal

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
	s, _ := openFlushing(t, 20*time.Millisecond)
	defer s.Close()
	a := reserve(t, s, entry("a"))
	require.NoError(t, update(s, "a", a.Key, journal.StatePending, 1, 0)) // arms the timer
	b := reserve(t, s, entry("b"))                                        // carries a's update
	before := s.stats().FileBytes
	require.NoError(t, update(s, "b", b.Key, journal.StateDone, 1, 200))
	require.Eventually(t, func() bool { return s.stats().FileBytes > before }, 5*time.Second, 5*time.Millisecond)
}
