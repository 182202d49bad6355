package filejournal

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A record whose creation time lies so far back that now minus it
// overflows int64 (a CreatedAt that Reserve accepts: CheckRecord does not
// bound it; or a crafted file) makes recoveredExpiredIDs' bound overflow
// too (now.wall-oldest.wall < 0), and Open then skips the walk and keeps
// every expired record, where expiredIDs (the code before 01c0bbb) dropped
// them: Recovery.Records counts the expired "old", and Open no longer
// compacts a journal past compactMin that holds an expired record.
func TestOpenDropsExpiredBesideAnOverflowingCreation(t *testing.T) {
	o, clk, t0 := hourClock()
	o.compactMin = 0
	dir := t.TempDir()
	ancient := doneAt("ancient", t0)
	ancient.CreatedAt = time.UnixMilli(math.MinInt64)
	s := openHolding(t, dir, o, doneAt("old", t0), ancient, entry("pending"))
	clk.Set(t0.Add(61 * time.Minute)) // seen to pass, written by Close
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	// expiredIDs finds "old" expired: the shortcut must not hide it.
	s.mu.Lock()
	want := len(s.expiredIDs())
	s.mu.Unlock()
	assert.Zero(t, want, "Open left an expired record in the index")
	assert.Equal(t, 2, rep.Records, "Recovery.Records counts the expired record Open should have dropped")
	assert.True(t, rep.Compacted, "Open did not compact away the expired record")
}
