package filejournal

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Tests of Close, and of the bounds on Sync: Close's errors, calls racing
// Close, contexts, a stalled rename.

// closeFailingFile fails its Close with errClose, after closing the file.
type closeFailingFile struct{ file }

var errClose = errors.New("injected EIO")

func (f closeFailingFile) Close() error {
	_ = f.file.Close()
	return errClose
}

// A journal file that fails to close: Close says so once, with the package
// prefix once and "close" once, and the cause stays reachable.
func TestCloseErrorSaysCloseOnce(t *testing.T) {
	t.Parallel()
	o := testOpts()
	o.hooks = &hooks{wrapFile: func(name string, f file) file {
		if name == journalName {
			return closeFailingFile{f}
		}
		return f
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	reserve(t, s, entry("a"))
	err := s.Close()
	require.ErrorIs(t, err, errClose)
	require.EqualError(t, err, "idemretry: journal close: injected EIO")
}

// TestCloseRacingCalls: Close while 12 goroutines Reserve, Update,
// Forget and Sync (with compactions running): every call returns, nil or
// an error wrapping journal.ErrClosed; after a reopen, every Reserve that
// returned is there with its key unless a Forget of it began, every
// Forget that returned holds, and every Update that returned nil is on
// disk (Close writes what was queued before it), attempts included.
func TestCloseRacingCalls(t *testing.T) {
	onlyOn(t, "linux", "darwin")
	t.Parallel()
	for round := range 6 {
		o := crashOpts()
		dir := t.TempDir()
		j, _ := mustOpen(t, dir, o)
		ctx := context.Background()
		type idState struct {
			key                 string
			attempts            int // the highest whose Update returned nil
			forgetting, forgone bool
		}
		const workers = 12
		states := make([]map[string]*idState, workers)
		var wg sync.WaitGroup
		var calls atomic.Int64
		errs := make(chan error, workers)
		for g := range workers {
			states[g] = map[string]*idState{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids := states[g]
				closed := func(err error) bool {
					if err == nil {
						return false
					}
					if !errors.Is(err, journal.ErrClosed) {
						errs <- fmt.Errorf("worker %d: %w", g, err)
					}
					return true
				}
				for i := 0; ; i++ {
					id := fmt.Sprintf("r%d-w%d-%d", round, g, i/8)
					s := ids[id]
					calls.Add(1)
					switch {
					case s == nil:
						e := entry(id)
						got, _, err := j.Reserve(ctx, e, journal.ReuseAny)
						if closed(err) {
							return
						}
						ids[id] = &idState{key: got.Key}
					case i%8 == 7 && g%3 == 0:
						s.forgetting = true
						if closed(j.Forget(ctx, id)) {
							return
						}
						s.forgone = true
					case i%8 == 6:
						if closed(j.Sync(ctx)) {
							return
						}
					default:
						a := s.attempts + 1 + i%300
						if closed(update(j, id, s.key, journal.StatePending, uint32(a), 0)) {
							return
						}
						s.attempts = a
					}
				}
			}()
		}
		for calls.Load() < int64(200+round*300) {
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, j.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		j, _ = mustOpen(t, dir, o)
		n := 0
		for _, ids := range states {
			for id, s := range ids {
				got, ok, err := j.Get(ctx, id)
				require.NoError(t, err)
				switch {
				case s.forgone:
					require.False(t, ok, "round %d: forgotten %s is back", round, id)
				case !ok:
					require.True(t, s.forgetting, "round %d: acknowledged %s lost", round, id)
				default:
					require.Equal(t, s.key, got.Key, "round %d: %s", round, id)
					require.GreaterOrEqual(t, got.Attempts, s.attempts, "round %d: %s: an Update returned nil before Close and is not on disk", round, id)
					n++
				}
			}
		}
		require.NoError(t, j.Close())
		require.Positive(t, n)
	}
}

// The context part of hW2's review of the file journal: a call whose
// context ends returns, whatever the committer is stuck in.

// openStalling opens a journal whose committer stops at failpoint fp until
// release is called (or the test ends), and returns it with a channel
// closed once the committer is stopped there.
func openStalling(t *testing.T, fp string) (j *Journal, stalled <-chan struct{}, release func()) {
	t.Helper()
	at, free := make(chan struct{}), make(chan struct{})
	var once, onceFree sync.Once
	var armed atomic.Bool // not during Open, which creates the journal
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fp && armed.Load() {
			once.Do(func() { close(at) })
			<-free
		}
	}}
	j, _ = mustOpen(t, t.TempDir(), o)
	armed.Store(true)
	release = func() { onceFree.Do(func() { close(free) }) }
	t.Cleanup(func() { release(); _ = j.Close() })
	return j, at, release
}

// TestSyncBoundedDuringCompactionRename: a Sync with nothing to write
// checks that the journal is still in its directory (present), under the
// lock a compaction holds from its rename until its new file is in use:
// the directory's fsync, on a stalled disk, takes as long as it takes. The
// Sync's context bounds its wait all the same (it waited for the
// compaction, past its 100 ms deadline, until the test let the compaction
// go 5 s later), and once the compaction is done a Sync works as before.
func TestSyncBoundedDuringCompactionRename(t *testing.T) {
	j, stalled, release := openStalling(t, fpRenamed)
	e := reserve(t, j, entry("a"))
	compacted := make(chan error, 1)
	go func() { compacted <- j.Compact(context.Background()) }()
	select {
	case <-stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("the compaction never reached its rename")
	}
	// Whatever happens below, the compaction goes on 5 s from now.
	let := time.AfterFunc(5*time.Second, release)
	defer let.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- j.Sync(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(4 * time.Second):
		t.Fatal("Sync waited for the compaction's rename past its context's end (4 s after a 100 ms deadline)")
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, errors.Is(err, journal.ErrClosed), "a Sync cut short by its context does not stop the journal: %v", err)

	release()
	require.NoError(t, <-compacted)
	require.NoError(t, j.Sync(context.Background()))
	got, ok, err := j.Get(context.Background(), "a")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, e.Key, got.Key)
}

// TestSyncDuringStalledRenameBoundedGoroutines: Syncs with nothing to
// write, each cut short by its context while a compaction is stalled in its
// rename step (a stalled disk), must not each leave a goroutine behind
// waiting for the compaction: a caller that retries every request would
// pile up goroutines for as long as the disk stalls. Once the compaction
// goes on, every check ends and Sync works as before.
func TestSyncDuringStalledRenameBoundedGoroutines(t *testing.T) {
	j, stalled, release := openStalling(t, fpRenamed)
	reserve(t, j, entry("a"))
	compacted := make(chan error, 1)
	go func() { compacted <- j.Compact(context.Background()) }()
	select {
	case <-stalled:
	case <-time.After(20 * time.Second):
		t.Fatal("the compaction never reached its rename")
	}
	let := time.AfterFunc(60*time.Second, release)
	defer let.Stop()

	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	const calls = 500
	for range calls {
		require.ErrorIs(t, j.Sync(ctx), context.Canceled)
	}
	grown := runtime.NumGoroutine() - before
	require.Less(t, grown, 50, "%d Syncs cut short left %d goroutines waiting for the compaction", calls, grown)

	release()
	require.NoError(t, <-compacted)
	require.NoError(t, j.Sync(context.Background()))
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+2 }, 10*time.Second, 10*time.Millisecond)
}
