package filejournal

import (
	"context"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Sync promises to wait until every update queued so far is durable. An
// update that a committing batch has already taken off the queue, but not
// yet synced, must be waited for too: the queue is empty then, yet the
// update is not durable. (Found in review: Sync returned at once.)
func TestSyncWaitsForBatchInFlight(t *testing.T) {
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
