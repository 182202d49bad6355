package filejournal

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// TestHW2DirectoryReplacedDuringCompaction: while a compaction writes and
// syncs journal.tmp, its directory is moved away and another Journal (as
// another process would) opens a new journal at the same path and
// acknowledges a record. The compaction must not touch that journal: its
// rename fails (journal.tmp is in the old directory), and the Journal
// must then stop (ErrRemoved), not reopen "journal" by its path, which
// now names the other journal's file, and append its own frames to it.
// Before the fix it did: its next Reserve was acknowledged into the other
// journal's file, which then failed to open (bytes that are no frame
// before the other Journal's later frame).
func TestHW2DirectoryReplacedDuringCompaction(t *testing.T) {
	r := newReplacedDirRig(t, fpTmpSynced)
	j := r.j
	reserve(t, j, entry("mine"))
	r.armed.Store(true)
	ctx := context.Background()
	err := j.Compact(ctx)
	require.Error(t, err)
	require.NotNil(t, r.other, "the failpoint ran")

	_, _, err = j.Reserve(ctx, entry("mine-after"), journal.ReuseAny)
	require.ErrorIs(t, err, ErrRemoved, "a Reserve after the compaction whose directory was replaced")
	require.ErrorIs(t, err, journal.ErrClosed)
	require.ErrorIs(t, j.Close(), ErrRemoved)

	// The other journal goes on, and opens whole, as it wrote it.
	reserve(t, r.other, entry("theirs-2"))
	require.NoError(t, r.other.Close())
	again, rep := mustOpen(t, r.dir, testOpts())
	defer again.Close()
	require.False(t, rep.TornTail, "nothing but the other journal's frames in its file")
	got, ok, err := again.Get(ctx, "theirs")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, r.otherKey, got.Key)
	for _, id := range []string{"mine", "mine-after"} {
		_, ok, err := again.Get(ctx, id)
		require.NoError(t, err)
		require.False(t, ok, "%s is the moved journal's", id)
	}
}

// TestHW2DirectoryReplacedBeforeTempMade: the directory is replaced after
// the compaction's first check that the journal is there and before it
// makes journal.tmp, so that its journal.tmp is made in the other
// journal's directory. The check before the rename stops the Journal; the
// journal.tmp it made there must go with it: left, the other journal's
// next Open would take it for its own snapshot whose rename was lost (its
// base sequence is past the other journal's last frame) and adopt it,
// losing the other journal's records for this one's. The other Journal's
// own journal.tmp, made meanwhile, would not be touched: only the file
// this Journal made is removed.
func TestHW2DirectoryReplacedBeforeTempMade(t *testing.T) {
	r := newReplacedDirRig(t, fpCompactBegin)
	j := r.j
	// Sequences past the other journal's, so that its Open would adopt
	// this one's snapshot.
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5", "m6"} {
		reserve(t, j, entry(id))
	}
	r.armed.Store(true)
	ctx := context.Background()
	require.ErrorIs(t, j.Compact(ctx), ErrRemoved)
	require.NotNil(t, r.other, "the failpoint ran")
	_, _, err := j.Reserve(ctx, entry("mine-after"), journal.ReuseAny)
	require.ErrorIs(t, err, ErrRemoved)
	require.ErrorIs(t, j.Close(), ErrRemoved)

	require.NoError(t, r.other.Close())
	again, rep := mustOpen(t, r.dir, testOpts())
	defer again.Close()
	require.False(t, rep.AdoptedTemp, "the other journal adopted the moved one's snapshot")
	got, ok, err := again.Get(ctx, "theirs")
	require.NoError(t, err)
	require.True(t, ok, "the other journal's record")
	require.Equal(t, r.otherKey, got.Key)
	_, ok, err = again.Get(ctx, "m1")
	require.NoError(t, err)
	require.False(t, ok)
}

// replacedDirRig is a Journal in root/j whose failpoint fp, once armed,
// moves the directory away and opens another Journal at its path, as
// another process would, which reserves "theirs".
type replacedDirRig struct {
	root, dir string
	j         *Journal
	armed     atomic.Bool
	other     *Journal
	otherKey  string
}

func newReplacedDirRig(t *testing.T, fp string) *replacedDirRig {
	r := &replacedDirRig{root: t.TempDir()}
	r.dir = filepath.Join(r.root, "j")
	var once sync.Once
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name != fp || !r.armed.Load() {
			return
		}
		once.Do(func() {
			require.NoError(t, os.Rename(r.dir, filepath.Join(r.root, "moved")))
			r.other, _ = mustOpen(t, r.dir, testOpts())
			r.otherKey = reserve(t, r.other, entry("theirs")).Key
		})
	}}
	r.j, _ = mustOpen(t, r.dir, o)
	return r
}
