package idemretry

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Clock is the Transport's source of time: it reads the key window from Now
// and waits on the timers it makes. It reuses cenkalti/backoff's Clock and
// Timer interfaces, so one fake serves both. The default is the system clock.
// A Clock must be safe for concurrent use.
type Clock interface {
	backoff.Clock
	// NewTimer returns a stopped timer; the Transport Starts it for each wait.
	NewTimer() backoff.Timer
}

type systemClock struct{}

func (systemClock) Now() time.Time          { return time.Now() }
func (systemClock) NewTimer() backoff.Timer { return &systemTimer{} }

// systemTimer is a backoff.Timer over time.Timer.
type systemTimer struct{ t *time.Timer }

func (s *systemTimer) Start(d time.Duration) {
	if s.t == nil {
		s.t = time.NewTimer(d)
		return
	}
	s.t.Reset(d)
}

func (s *systemTimer) Stop() {
	if s.t != nil {
		s.t.Stop()
	}
}

func (s *systemTimer) C() <-chan time.Time { return s.t.C }
