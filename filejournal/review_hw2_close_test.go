//go:build linux || darwin

package filejournal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// TestHW2CloseRacingCalls: Close while 12 goroutines Reserve, Update,
// Forget and Sync (with compactions running): every call returns, nil or
// an error wrapping journal.ErrClosed; after a reopen, every Reserve that
// returned is there with its key unless a Forget of it began, every
// Forget that returned holds, and every Update that returned nil is on
// disk (Close writes what was queued before it), attempts included.
func TestHW2CloseRacingCalls(t *testing.T) {
	for round := range 6 {
		o := crashOpts()
		dir := t.TempDir()
		j, _ := mustOpen(t, dir, o)
		ctx := context.Background()
		type idState struct {
			key                 string
			attempts            int // the highest whose Update returned nil
			forgetting, forgone bool
		}
		const workers = 12
		states := make([]map[string]*idState, workers)
		var wg sync.WaitGroup
		var calls atomic.Int64
		errs := make(chan error, workers)
		for g := range workers {
			states[g] = map[string]*idState{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids := states[g]
				closed := func(err error) bool {
					if err == nil {
						return false
					}
					if !errors.Is(err, journal.ErrClosed) {
						errs <- fmt.Errorf("worker %d: %w", g, err)
					}
					return true
				}
				for i := 0; ; i++ {
					id := fmt.Sprintf("r%d-w%d-%d", round, g, i/8)
					s := ids[id]
					calls.Add(1)
					switch {
					case s == nil:
						e := entry(id)
						got, _, err := j.Reserve(ctx, e, journal.ReuseAny)
						if closed(err) {
							return
						}
						ids[id] = &idState{key: got.Key}
					case i%8 == 7 && g%3 == 0:
						s.forgetting = true
						if closed(j.Forget(ctx, id)) {
							return
						}
						s.forgone = true
					case i%8 == 6:
						if closed(j.Sync(ctx)) {
							return
						}
					default:
						a := s.attempts + 1 + i%300
						if closed(update(j, id, s.key, journal.StatePending, uint32(a), 0)) {
							return
						}
						s.attempts = a
					}
				}
			}()
		}
		for calls.Load() < int64(200+round*300) {
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, j.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		j, _ = mustOpen(t, dir, o)
		n := 0
		for _, ids := range states {
			for id, s := range ids {
				got, ok, err := j.Get(ctx, id)
				require.NoError(t, err)
				switch {
				case s.forgone:
					require.False(t, ok, "round %d: forgotten %s is back", round, id)
				case !ok:
					require.True(t, s.forgetting, "round %d: acknowledged %s lost", round, id)
				default:
					require.Equal(t, s.key, got.Key, "round %d: %s", round, id)
					require.GreaterOrEqual(t, got.Attempts, s.attempts, "round %d: %s: an Update returned nil before Close and is not on disk", round, id)
					n++
				}
			}
		}
		require.NoError(t, j.Close())
		require.Positive(t, n)
	}
}
