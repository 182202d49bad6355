package filejournal

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

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

// TestHW2SyncBoundedDuringCompactionRename: a Sync with nothing to write
// checks that the journal is still in its directory (present), under the
// lock a compaction holds from its rename until its new file is in use:
// the directory's fsync, on a stalled disk, takes as long as it takes. The
// Sync's context bounds its wait all the same (it waited for the
// compaction, past its 100 ms deadline, until the test let the compaction
// go 5 s later), and once the compaction is done a Sync works as before.
func TestHW2SyncBoundedDuringCompactionRename(t *testing.T) {
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
