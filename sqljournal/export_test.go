package sqljournal

import (
	"time"
)

// SuspendedFor makes j's reading of the database's clock what it would be
// after this machine had been suspended for d since the reading: the
// monotonic clock that Now advances it by stands still while suspended.
func SuspendedFor(j *Journal, d time.Duration) {
	j.clk.mu.Lock()
	defer j.clk.mu.Unlock()
	j.clk.base = j.clk.base.Add(-d)
}
