package payments

import (
	"time"

	"github.com/idemretry/idemretry"
)

// Clock is virtual time running Scale times faster than the wall clock. It
// is an idemretry.TimerClock, so the Transport waits its real backoff
// durations on it: a 4 s wait takes 4s/Scale of wall time. The simulation
// scales the clock rather than the durations because Retry-After has a
// resolution of one second and the library's defaults are meant to be
// shown as they ship.
//
// It is safe for concurrent use.
type Clock struct {
	scale  float64
	origin time.Time // wall time at which virtual time equals wall time
}

// NewClock returns a clock running scale times faster than the wall clock
// (scale >= 1).
func NewClock(scale float64) *Clock {
	if scale < 1 {
		scale = 1
	}
	return &Clock{scale: scale, origin: time.Now()}
}

// Scale returns how many times faster than the wall clock virtual time runs.
func (c *Clock) Scale() float64 { return c.scale }

// Now returns the virtual time.
func (c *Clock) Now() time.Time {
	return c.origin.Add(c.Virtual(time.Since(c.origin)))
}

// Real converts a virtual duration into the wall time it takes.
func (c *Clock) Real(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.scale)
}

// Virtual converts a wall-clock duration into virtual time.
func (c *Clock) Virtual(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.scale)
}

// Sleep waits d of virtual time.
func (c *Clock) Sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(c.Real(d))
	}
}

// NewTimer returns a stopped timer that fires after virtual durations.
func (c *Clock) NewTimer() idemretry.Timer { return &timer{clock: c} }

// timer is an idemretry.Timer over a time.Timer armed with the real duration.
type timer struct {
	clock *Clock
	t     *time.Timer
}

func (t *timer) Start(d time.Duration) {
	if t.t == nil {
		t.t = time.NewTimer(t.clock.Real(d))
		return
	}
	t.t.Reset(t.clock.Real(d))
}

func (t *timer) Stop() {
	if t.t != nil {
		t.t.Stop()
	}
}

func (t *timer) C() <-chan time.Time {
	if t.t == nil {
		return nil // never started: never fires
	}
	return t.t.C
}
