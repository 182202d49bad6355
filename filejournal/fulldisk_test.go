package filejournal

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reserveUntilFull reserves new actions named prefix0, prefix1, ... until
// one is refused, and returns the records acknowledged before, and the
// error. A full tmpfs still takes the writes that fit in the journal's
// last page: the first few batches after the disk filled may succeed.
func reserveUntilFull(t *testing.T, s *Journal, prefix string) ([]journal.Record, error) {
	t.Helper()
	var acked []journal.Record
	for i := range 1000 {
		r, _, err := s.Reserve(context.Background(), entry(fmt.Sprintf("%s%d", prefix, i)), journal.ReuseAny)
		if err != nil {
			return acked, err
		}
		acked = append(acked, r)
	}
	t.Fatal("the journal never filled the disk")
	return nil, nil
}

// requireFullDiskError requires err to be what a call that must write
// returns while the disk is full: journal.ErrUnavailable and the file
// system's ENOSPC, not journal.ErrClosed (the Journal is not stopped).
func requireFullDiskError(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, journal.ErrUnavailable)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NotErrorIs(t, err, journal.ErrClosed)
}

// Issue 30, item 4: a full disk stopped the journal for good, until it was
// reopened, and lost the updates it had queued. Now, on a real full file
// system, a call that must write is refused with a typed error and leaves
// no record; what was acknowledged before stays, so do the queued updates;
// once there is room again, the next call succeeds, with no reopen, and
// Close loses nothing.
func TestFullDiskRecoversWhenSpaceReturns(t *testing.T) {
	mnt := smallFSOf(t, "1m")
	dir := filepath.Join(mnt, "j")
	o := testOpts()
	o.flushEvery = time.Hour // the updates wait for a batch, or Close
	s, _ := mustOpen(t, dir, o)
	t.Cleanup(func() { _ = s.Close() }) // before the unmount, on a failure
	ctx := context.Background()
	a := reserve(t, s, entry("a"))
	a.State, a.Attempts, a.Status = journal.StateDone, 1, 201
	require.NoError(t, s.Update(ctx, a)) // lazy: queued
	u := reserve(t, s, entry("u"))

	fill(t, mnt)
	acked, err := reserveUntilFull(t, s, "full")
	requireFullDiskError(t, err)
	refused := fmt.Sprintf("full%d", len(acked))
	_, found, err := s.Get(ctx, refused)
	require.NoError(t, err)
	assert.False(t, found, "a refused Reserve left its record")
	// While the disk stays full: refused again, each time.
	for range 3 {
		_, _, err = s.Reserve(ctx, entry(refused), journal.ReuseAny)
		requireFullDiskError(t, err)
	}
	// Reads and lazy updates go on; Sync waits for the updates, and fails.
	got, found, err := s.Get(ctx, "a")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, journal.StateDone, got.State)
	u.State, u.Attempts, u.Status = journal.StateDone, 2, 200
	require.NoError(t, s.Update(ctx, u))
	requireFullDiskError(t, s.Sync(ctx))

	unfill(t, mnt)
	b := reserve(t, s, entry(refused)) // the next call succeeds
	require.NoError(t, s.Sync(ctx))
	c := reserve(t, s, entry("c"))
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.False(t, rep.TornTail, "a batch that failed left its frame: %+v", rep)
	for _, want := range append([]journal.Record{a, u, b, c}, acked...) {
		got, ok, err := s.Get(ctx, want.ActionID)
		require.NoError(t, err)
		require.True(t, ok, "acknowledged %s lost", want.ActionID)
		assert.Equal(t, want.Key, got.Key, want.ActionID)
		assert.Equal(t, want.State, got.State, want.ActionID)
		assert.Equal(t, want.Status, got.Status, want.ActionID)
	}
}
