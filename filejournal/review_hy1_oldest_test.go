package filejournal

import (
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A record whose creation time lies so far back that now minus it
// overflowed int64 (a CreatedAt that Reserve accepted before CheckRecord
// bounded it) made recoveredExpiredIDs' bound overflow too
// (now.wall-oldest.wall < 0), and Open then skipped the walk and kept
// every expired record, where expiredIDs (the code before 01c0bbb) dropped
// them: Recovery.Records counted the expired "old", and Open no longer
// compacted a journal past compactMin that held an expired record. The
// oldest creation time CheckRecord allows is the test now.
func TestOpenDropsExpiredBesideAnOverflowingCreation(t *testing.T) {
	o, clk, t0 := hourClock()
	o.compactMin = 0
	dir := t.TempDir()
	ancient := doneAt("ancient", t0)
	ancient.CreatedAt = time.UnixMilli(journal.MinCreatedAtUnixMilli)
	s := openHolding(t, dir, o, doneAt("old", t0), ancient, entry("pending"))
	clk.Set(t0.Add(61 * time.Minute)) // seen to pass, written by Close
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	// expiredIDs finds "old" and "ancient" expired: the shortcut must
	// not hide them.
	s.mu.Lock()
	want := len(s.expiredIDs())
	s.mu.Unlock()
	assert.Zero(t, want, "Open left an expired record in the index")
	assert.Equal(t, 1, rep.Records, "Recovery.Records counts an expired record Open should have dropped (old, or the ancient one)")
	assert.True(t, rep.Compacted, "Open did not compact away the expired record")
}
