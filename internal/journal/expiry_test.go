package journal

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// T13: done records past the retention are dropped by compaction and ignored
// by lookups; pending and unknown ones never expire; a clock set back
// neither revives nor loses anything, across restarts too.
func TestExpiryFakeClock(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	o := testOpts()
	o.Now, o.Retention = clk.Now, time.Hour
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	mk := func(id string, state uint8) Entry {
		e := entry(id)
		e.CreatedMs = t0.UnixMilli()
		got := reserve(t, s, e)
		if state != StatePending {
			require.NoError(t, s.Update(id, state, 1, 200))
		}
		return got
	}
	done := mk("done", StateDone)
	mk("done2", StateDone)
	pending, unknown := mk("pending", StatePending), mk("unknown", StateUnknown)

	clk.Set(t0.Add(59 * time.Minute)) // within the retention
	got, created, err := s.Reserve(context.Background(), entry("done"), false)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, done.Key, got.Key)

	clk.Set(t0.Add(61 * time.Minute)) // past it
	_, ok, _ := s.Get("done2")
	assert.False(t, ok, "expired done record visible")
	clk.Set(t0) // the clock jumps back: done2 stays expired
	_, ok, _ = s.Get("done2")
	assert.False(t, ok, "clock set back revived an expired record")
	got, created, err = s.Reserve(context.Background(), entry("done"), false)
	require.NoError(t, err)
	assert.True(t, created, "expired done record reused")
	assert.NotEqual(t, done.Key, got.Key)

	clk.Set(t0.Add(1000 * time.Hour))
	require.NoError(t, s.Compact(context.Background()))
	require.NoError(t, s.Close())

	clk.Set(t0) // restart with the clock set back
	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	// Only pending and unknown records survive (the new "done" is pending).
	assert.Equal(t, 3, rep.Records)
	for _, e := range []Entry{pending, unknown} {
		got, ok, _ := s.Get(e.ID)
		require.True(t, ok, e.ID)
		assert.Equal(t, e.Key, got.Key)
	}
	_, ok, _ = s.Get("done2")
	assert.False(t, ok)
	un, err := s.Unfinished()
	require.NoError(t, err)
	assert.Len(t, un, 3)
}

// A clock set back before a restart, with no compaction in between, must
// not revive a record that had expired: the high-water mark is persisted.
func TestClockHighWaterPersists(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	o := testOpts()
	o.Now, o.Retention = clk.Now, time.Hour
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	e := entry("d")
	e.CreatedMs, e.State = t0.UnixMilli(), StateDone
	reserve(t, s, e)
	clk.Set(t0.Add(2 * time.Hour))
	reserve(t, s, entry("other")) // a batch carries the clock
	require.NoError(t, s.Close())
	clk.Set(t0)
	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	_, ok, _ := s.Get("d")
	assert.False(t, ok)
}
