package filejournal

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHW4SyncDuringStalledRenameBoundedGoroutines: Syncs with nothing to
// write, each cut short by its context while a compaction is stalled in its
// rename step (a stalled disk), must not each leave a goroutine behind
// waiting for the compaction: a caller that retries every request would
// pile up goroutines for as long as the disk stalls. Once the compaction
// goes on, every check ends and Sync works as before.
func TestHW4SyncDuringStalledRenameBoundedGoroutines(t *testing.T) {
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
