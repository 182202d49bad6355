package filejournal

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// TestHW2LockRemovedWhileOpen: LOCK deleted (a cleanup of "stale" lock
// files), or deleted and made again, while a Journal holds it. The lock
// is on the deleted inode, so a second Open, in this process or another,
// makes a new LOCK and gets it: two Journals on one file. The first must
// then write nothing more: its next batch fails (ErrRemoved, and it
// stops) instead of appending frames among the other's. Before the fix
// both appended: the first one's Reserve was acknowledged, and the journal
// then failed to open ("bytes that are no frame before frame 4"), every
// record after the damage lost but to a salvage.
func TestHW2LockRemovedWhileOpen(t *testing.T) {
	for _, remade := range []bool{false, true} {
		dir := t.TempDir()
		ctx := context.Background()
		a, _ := mustOpen(t, dir, testOpts())
		a1 := reserve(t, a, entry("a1"))
		require.NoError(t, os.Remove(filepath.Join(dir, lockName)))
		if remade {
			require.NoError(t, os.WriteFile(filepath.Join(dir, lockName), nil, 0o600))
		}
		b, _, err := openWith(dir, testOpts())
		require.NoError(t, err, "the lock is gone with its file: nothing stops this Open")
		b1 := reserve(t, b, entry("b1"))

		_, _, err = a.Reserve(ctx, entry("a2"), journal.ReuseAny)
		require.ErrorIs(t, err, ErrRemoved, "remade %v: a Reserve of the Journal whose LOCK was removed", remade)
		require.ErrorIs(t, err, journal.ErrClosed)
		require.Error(t, a.Close())

		b2 := reserve(t, b, entry("b2"))
		require.NoError(t, b.Close())
		c, rep, err := openWith(dir, testOpts())
		require.NoError(t, err, "remade %v", remade)
		require.False(t, rep.TornTail)
		for _, want := range []journal.Record{a1, b1, b2} {
			got, ok, err := c.Get(ctx, want.ActionID)
			require.NoError(t, err)
			require.True(t, ok, "%s", want.ActionID)
			require.Equal(t, want.Key, got.Key)
		}
		_, ok, err := c.Get(ctx, "a2")
		require.NoError(t, err)
		require.False(t, ok)
		require.NoError(t, c.Close())
	}
}
