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
	s := newHashSet(0)
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
