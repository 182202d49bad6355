package payments

import (
	"sync"
	"time"
)

// stallWatch measures how late a 1 ms wall-clock ticker fires while a run
// plays. The virtual clock is the wall clock sped up, so when the machine
// stalls the process (a shared, busy machine does), virtual time jumps
// ahead while no client or server code runs: an outage can pass unseen and
// healthy attempts time out. A run whose worst stall is too long is played
// again (see Play).
type stallWatch struct {
	stop chan struct{}
	done sync.WaitGroup
	mu   sync.Mutex
	max  time.Duration
}

func watchStalls() *stallWatch {
	w := &stallWatch{stop: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		const tick = time.Millisecond
		t := time.NewTicker(tick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-w.stop:
				return
			case now := <-t.C:
				if gap := now.Sub(last) - tick; gap > 0 {
					w.mu.Lock()
					w.max = max(w.max, gap)
					w.mu.Unlock()
				}
				last = now
			}
		}
	}()
	return w
}

// finish stops the watch and returns the longest stall, in wall time.
func (w *stallWatch) finish() time.Duration {
	close(w.stop)
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}
