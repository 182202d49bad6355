package filejournal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countLive, the size recovery gives the index's map, is the number of
// records recovery loads: for a journal of new records only, and for one
// with updates, forgotten records and records created again.
func TestCountLiveIsTheRecordsLoaded(t *testing.T) {
	assert.Equal(t, 5000, countLive(memSource(recoveryJournal(5000))))

	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	ctx := context.Background()
	var es []journal.Record
	for i := range 300 {
		es = append(es, reserve(t, s, entry(fmt.Sprintf("a-%d", i))))
	}
	for _, e := range es[:100] {
		require.NoError(t, s.Forget(ctx, e.ActionID))
	}
	for _, e := range es[100:150] {
		require.NoError(t, update(s, e.ActionID, e.Key, journal.StateDone, 1, 201))
	}
	for _, e := range es[:20] {
		reserve(t, s, entry(e.ActionID))
	}
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	assert.Equal(t, 220, countLive(memSource(data)))
	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.Equal(t, 220, rep.Records)
}

// hashSet counts members through growth, removals and re-additions.
func TestHashSet(t *testing.T) {
	s := new(hashSet)
	s.reset(0)
	for i := range uint32(10_000) {
		s.add(i * 2654435761)
		s.add(i * 2654435761) // again: no change
	}
	require.Equal(t, 10_000, s.n)
	for i := range uint32(5_000) {
		s.remove(i * 2654435761)
		s.remove(i * 2654435761)
	}
	require.Equal(t, 5_000, s.n)
	for i := range uint32(10_000) {
		s.add(i * 2654435761)
	}
	assert.Equal(t, 10_000, s.n)
	assert.LessOrEqual(t, 4*s.used, 3*len(s.slots))
}

// splitmix64 is a fixed stand-in for the ids' hashes: countLive's seed is
// random, and a test must see the same hashes every run.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// liveCounter counts what the operations leave, in their order, whatever
// its first guess: creations, deletions, re-creations after a deletion and
// deletions of ids never created, against a map replaying the same.
func TestLiveCounterFollowsOperationOrder(t *testing.T) {
	for _, hint := range []int{0, 1000, 1 << 20} {
		c := newLiveCounter(hint)
		want := map[uint64]bool{}
		op := func(i int, upsert bool) {
			h := splitmix64(uint64(i))
			c.add(h, upsert)
			if upsert {
				want[h] = true
			} else {
				delete(want, h)
			}
		}
		const n = 100_000
		for i := range n {
			op(i, true)
			op(i, true) // an update: the same id again
		}
		for i := 0; i < n; i += 2 {
			op(i, false)
		}
		for i := 0; i < n; i += 4 {
			op(i, true) // created again after its deletion
		}
		for i := n; i < n+1000; i++ {
			op(i, false) // never created
		}
		for i := 1; i < n; i += 8 {
			op(i, false)
			op(i, true)
			op(i, false)
		}
		require.Equal(t, len(want), c.count(), "hint %d", hint)
	}
}

// hashSet.reset sizes the table so that as many members as it was told
// fit without a rehash, and reuses a table that is large enough.
func TestHashSetResetHoldsItsHint(t *testing.T) {
	var s hashSet
	for _, hint := range []int{0, 5, 16, 100, 4000, 3000} {
		s.reset(hint)
		size := len(s.slots)
		for i := range uint32(hint) {
			s.add(uint32(splitmix64(uint64(i))))
		}
		require.Equal(t, size, len(s.slots), "rehashed with %d members", hint)
		require.LessOrEqual(t, s.n, hint)
	}
	big := cap(s.slots)
	s.reset(10)
	require.Equal(t, big, cap(s.slots), "a large enough table was not reused")
	require.Zero(t, s.n)
	for _, v := range s.slots {
		require.Zero(t, v)
	}
}
