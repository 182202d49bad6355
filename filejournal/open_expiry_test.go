package filejournal

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Open drops the records whose retention is over, even when most of the
// index is fresh: its walk over the index is skipped only when no record
// it replayed can have expired (recoveredExpiredIDs), and the one old
// record here must be found among the fresh ones.
func TestOpenDropsAnExpiredRecordAmongFreshOnes(t *testing.T) {
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s := openHolding(t, dir, o, doneAt("old", t0))
	clk.Set(t0.Add(30 * time.Minute))
	require.NoError(t, s.Close())

	s = openHolding(t, dir, o, doneAt("fresh1", clk.Now()), doneAt("fresh2", clk.Now()), entry("pending"))
	clk.Set(t0.Add(61 * time.Minute)) // seen to pass, written by Close
	require.NoError(t, s.Close())

	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	assert.Equal(t, 3, s.stats().Records, "Open kept the record whose retention is over, or dropped another")
	for _, id := range []string{"fresh1", "fresh2", "pending"} {
		_, ok, err := s.get(id)
		require.NoError(t, err)
		assert.True(t, ok, id)
	}
}

// Open with nothing old enough to expire keeps every record (the walk is
// skipped), and one whose retention ended on the clock but not in the time
// the journal has seen pass is kept too.
func TestOpenWithNothingExpiredKeepsEveryRecord(t *testing.T) {
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s := openHolding(t, dir, o, doneAt("a", t0), doneAt("b", t0), entry("c"))
	clk.Set(t0.Add(59 * time.Minute))
	require.NoError(t, s.Close())
	clk.Set(t0.Add(5 * time.Hour)) // the clock jumped while closed

	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	assert.Equal(t, 3, s.stats().Records)
}

// longerAgo is now-t > d on the whole range of int64, where the
// subtraction itself would overflow.
func TestLongerAgo(t *testing.T) {
	for _, c := range []struct {
		now, t, d int64
		want      bool
	}{
		{100, 0, 99, true},
		{100, 0, 100, false},
		{100, 100, 0, false},
		{100, 200, 0, false},
		{1_700_000_000_000, math.MinInt64, 3_600_000, true},
		{math.MaxInt64, math.MinInt64, math.MaxInt64, true},
		{math.MinInt64, math.MaxInt64, 0, false},
		{0, math.MaxInt64, 0, false},
	} {
		assert.Equal(t, c.want, longerAgo(c.now, c.t, c.d), "longerAgo(%d, %d, %d)", c.now, c.t, c.d)
	}
}
