package journal

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wall clock that jumps while the journal is closed (a clock that was
// behind, then corrected) expires nothing: time the journal has not seen
// pass is never counted. Time it sees pass while open is.
func TestExpiryIgnoresClockJumpWhileClosed(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	o := testOpts()
	o.Now, o.Retention = clk.Now, time.Hour
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	d := entry("d")
	d.CreatedMs, d.State = t0.UnixMilli(), StateDone
	d = reserve(t, s, d)
	require.NoError(t, s.Close())

	clk.Set(t0.Add(1000 * time.Hour)) // corrected while closed
	s, rep := mustOpen(t, dir, o)
	assert.Equal(t, 1, rep.Records, "the record was dropped at open")
	got, created, err := s.Reserve(context.Background(), entry("d"), false)
	require.NoError(t, err)
	assert.False(t, created, "a new key was minted for a record the journal saw made moments ago")
	assert.Equal(t, d.Key, got.Key)
	require.NoError(t, s.Compact(context.Background()))
	_, ok, _ := s.Get("d")
	assert.True(t, ok, "compaction dropped it")

	clk.Set(t0.Add(1000*time.Hour + 61*time.Minute)) // an hour passes, seen
	_, ok, _ = s.Get("d")
	assert.False(t, ok, "kept past its retention, with the time seen to pass")
	require.NoError(t, s.Close())
}

// The observed time survives a restart: time seen in one run counts in the
// next, so records still expire in an application that restarts often.
func TestObservedTimePersists(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	o := testOpts()
	o.Now, o.Retention = clk.Now, time.Hour
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	d := entry("d")
	d.CreatedMs, d.State = t0.UnixMilli(), StateDone
	reserve(t, s, d)
	clk.Set(t0.Add(40 * time.Minute))
	require.NoError(t, s.Close()) // writes the observed time

	clk.Set(t0.Add(-5 * time.Hour)) // whatever the clock says at the restart
	s, _ = mustOpen(t, dir, o)
	clk.Set(t0.Add(-5*time.Hour + 15*time.Minute))
	_, ok, _ := s.Get("d")
	assert.True(t, ok, "55 minutes seen")
	require.NoError(t, s.Close())

	clk.Set(t0.Add(2 * time.Hour))
	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	clk.Set(t0.Add(2*time.Hour + 6*time.Minute))
	_, ok, _ = s.Get("d")
	assert.False(t, ok, "61 minutes seen over three runs")
}

// A file written before observed times (no flagSeen, records without one)
// opens; its records age from the open, and the file is rewritten with the
// flag, so that versions expiring by the clock alone refuse it.
func TestOpenFileWithoutObservedTimes(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0.Add(100 * time.Hour)}
	o := testOpts()
	o.Now, o.Retention = clk.Now, time.Hour
	d := entry("d")
	d.CreatedMs, d.State = t0.UnixMilli(), StateDone
	dir := craftJournal(t, []op{upsert(t, d)}, []op{{kind: opClock, clock: t0.UnixMilli()}})
	s, rep := mustOpen(t, dir, o)
	assert.True(t, rep.Compacted)
	_, ok, _ := s.Get("d")
	assert.True(t, ok, "an old record dropped by the clock alone")
	clk.Set(t0.Add(101*time.Hour + time.Minute))
	_, ok, _ = s.Get("d")
	assert.False(t, ok)
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	h, err := parseHeader(data)
	require.NoError(t, err)
	assert.NotZero(t, h.flags&flagSeen)
}
