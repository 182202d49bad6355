package filejournal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Deleting the journal's directory under an open Journal is noticed at the
// next write: Reserve fails (nothing is acknowledged into the unlinked
// file), and so do Update, Sync and Close, with an error wrapping the closed
// sentinel and ErrRemoved.
func TestDirectoryRemovedFailsClosed(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "j")
	s, _ := mustOpen(t, dir, testOpts())
	a := reserve(t, s, entry("a"))
	require.NoError(t, os.RemoveAll(dir))

	_, _, err := s.Reserve(ctx, entry("b"), journal.ReuseAny)
	require.Error(t, err, "a new record acknowledged into a removed journal")
	assert.ErrorIs(t, err, ErrRemoved)
	assert.ErrorIs(t, err, journal.ErrClosed)
	err = update(s, "a", a.Key, journal.StateDone, 1, 201)
	assert.ErrorIs(t, err, ErrRemoved)
	assert.ErrorIs(t, err, journal.ErrClosed)
	err = s.Sync(ctx)
	assert.ErrorIs(t, err, ErrRemoved)
	assert.ErrorIs(t, err, journal.ErrClosed)
	err = s.Close()
	assert.ErrorIs(t, err, ErrRemoved)
	assert.ErrorIs(t, err, journal.ErrClosed)
}

// Sync and Close notice it too when nothing is left to write.
func TestDirectoryRemovedSyncAndClose(t *testing.T) {
	for _, call := range []string{"Sync", "Close"} {
		t.Run(call, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "j")
			s, _ := mustOpen(t, dir, testOpts())
			reserve(t, s, entry("a"))
			require.NoError(t, os.RemoveAll(dir))
			var err error
			if call == "Sync" {
				err = s.Sync(context.Background())
				assert.ErrorIs(t, err, ErrRemoved)
				err = s.Close()
			} else {
				err = s.Close()
			}
			assert.ErrorIs(t, err, ErrRemoved)
			assert.ErrorIs(t, err, journal.ErrClosed)
		})
	}
}

// A directory removed and created again, with a new journal in it (another
// process started meanwhile), is another journal: the Journal that still
// holds the old file stops.
func TestJournalReplacedFailsClosed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "j")
	s, _ := mustOpen(t, dir, testOpts())
	reserve(t, s, entry("a"))
	require.NoError(t, os.RemoveAll(dir))
	other, _ := mustOpen(t, dir, testOpts())
	defer other.Close()
	_, _, err := s.Reserve(context.Background(), entry("b"), journal.ReuseAny)
	assert.ErrorIs(t, err, ErrRemoved)
	assert.True(t, errors.Is(s.Close(), ErrRemoved))
}

// A compaction's rename replaces the journal file by design: it is not
// taken for a removal, even with Syncs racing it.
func TestCompactionIsNotRemoval(t *testing.T) {
	ctx := context.Background()
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			if err := s.Compact(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			require.NoError(t, s.Sync(ctx))
			reserve(t, s, entry("last"))
			return
		default:
		}
		require.NoError(t, s.Sync(ctx))
		if i%10 == 0 {
			reserve(t, s, entry(fmt.Sprintf("r%d", i)))
		}
	}
}
