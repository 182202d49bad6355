package filejournal

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Tests of how the committer is woken (run): one channel, with what woke it
// in Journal.ev.

// An idle journal leaves its committer asleep: after a batch, the only
// wake-ups are the fingerprint.key check that batch armed (due a
// secretCheckEvery after the last) and, for a lazy update, the flush
// timer; nothing comes back every second. On a phone each wake-up is a
// CPU woken from sleep.
func TestIdleCommitterIsNotWokenAgainAndAgain(t *testing.T) {
	var wakes atomic.Int64
	o := testOpts()
	o.flushEvery = 50 * time.Millisecond
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpWake {
			wakes.Add(1)
		}
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	defer s.Close()
	ctx := context.Background()
	e := entry("idle")
	_, _, err := s.Reserve(ctx, e, journal.ReuseAny)
	require.NoError(t, err)
	e.State, e.Status = journal.StateDone, 201
	require.NoError(t, s.Update(ctx, e)) // lazy: the flush timer writes it
	before := wakes.Load()
	idle := 4*secretCheckEvery + 500*time.Millisecond
	time.Sleep(idle)
	// One for the flush, one for the fingerprint.key check.
	require.LessOrEqual(t, wakes.Load()-before, int64(2),
		"the committer of a journal idle for %v was woken %d times", idle, wakes.Load()-before)
	got, found, err := s.get("idle")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, journal.StateDone, got.State)
}

// Compact calls and Close racing them: each Compact returns nil (done
// before the Journal stopped) or ErrClosed, none hangs, Close returns nil,
// and what was reserved before is in the reopened journal.
func TestCompactRacingCloseEndsEveryCall(t *testing.T) {
	for round := 0; round < 20; round++ {
		dir := t.TempDir()
		s, _ := mustOpen(t, dir, testOpts())
		ids := reserveNumbered(t, s, "c", 8)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				errs <- s.Compact(ctx)
			}()
		}
		require.NoError(t, s.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				require.ErrorIs(t, err, journal.ErrClosed)
			}
		}
		s2, rep := mustOpen(t, dir, testOpts())
		require.Equal(t, len(ids), rep.Records)
		require.NoError(t, s2.Close())
	}
}

// A Compact whose context has ended does nothing and says so.
func TestCompactWithEndedContextDoesNothing(t *testing.T) {
	var compactions atomic.Int64
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpCompactBegin {
			compactions.Add(1)
		}
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Compact(ctx), context.Canceled)
	require.NoError(t, s.Sync(context.Background()))
	require.Zero(t, compactions.Load())
	require.NoError(t, s.Compact(context.Background()))
	require.Equal(t, int64(1), compactions.Load())
}
