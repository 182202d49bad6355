package filejournal

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Forget promises to return "once the removal is synced". A second Forget
// of the same action, while the first one's delete is still queued or being
// written, finds the record already gone from memory: it must still wait
// for that delete's batch (Journal.deleting), or a crash at that moment would
// resurrect the record the caller was told is forgotten. (Found in review.)
func TestSecondForgetWaitsForRemovalSync(t *testing.T) {
	dir := t.TempDir()
	o := testOpts()
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	armed := false
	o.hooks = &hooks{failpoint: func(fp string) {
		if armed && fp == fpBeforeWrite {
			armed = false
			entered <- struct{}{}
			<-gate // hold the delete's frame before it is written
		}
	}}
	s, _ := mustOpen(t, dir, o)
	defer func() { close(gate); _ = s.Close() }()
	e := reserve(t, s, entry("pay:1"))
	armed = true // the committer reads it only after the next signal

	first := make(chan error, 1)
	go func() { first <- s.Forget(context.Background(), e.ActionID) }()
	<-entered // the first Forget's delete is taken by the committer, not written

	// Second caller: must not return before the removal is durable.
	done := make(chan error, 1)
	go func() { done <- s.Forget(context.Background(), e.ActionID) }()
	select {
	case err := <-done:
		require.NoError(t, err)
		// Crash now: the disk image is the file as it stands.
		data, err := os.ReadFile(filepath.Join(dir, journalName))
		require.NoError(t, err)
		crash := writeJournal(t, data)
		s2, _ := mustOpen(t, crash, testOpts())
		defer s2.Close()
		_, found, _ := s2.get(e.ActionID)
		require.False(t, found, "Forget returned nil, but after a crash the record is back")
	case <-time.After(300 * time.Millisecond):
		// Correct behaviour: the second Forget waits for the first's sync.
	}
}

// Forget, like Reserve, refuses an already-ended context before changing
// anything: otherwise it would remove the record (in memory at once, on
// disk with the next batch) and then report ctx's error, telling the caller
// the Forget failed while it took effect. (Found in review.)
func TestForgetWithEndedContextChangesNothing(t *testing.T) {
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	defer s.Close()
	e := reserve(t, s, entry("pay:1"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Forget(ctx, e.ActionID)
	require.Error(t, err)
	_, found, _ := s.get(e.ActionID)
	require.True(t, found, "Forget returned %v but the record is gone", err)
}
