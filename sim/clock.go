package sim

import (
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// epoch is where a history's virtual time starts, unless it runs on
// PostgreSQL, whose clock the journal keeps (journal.Timekeeper) and stamps
// creation times with: there it starts at the real time of the history's
// start, so that the two clocks agree but for the time the history lets
// pass.
var epoch = time.Date(2027, 3, 1, 9, 0, 0, 0, time.UTC)

// vclock is the virtual clock of one history: the Transport's Clock
// (idemretry.WithClock), the journals' clocks and the payment server's.
//
// It keeps two times. True time only goes forward: the server's key window
// and every check run on it. The wall time the Transport and the journals
// read is true time plus an offset that a clock jump changes (a clock set
// forward or back by its user); its readings carry no monotonic part, so a
// jump shows in every difference the Transport takes, as on a device whose
// clock was set (idemretry ages keys by the monotonic clock only with the
// system clock).
//
// Timers fire at once: Start(d) moves true time forward to when the timer
// would have fired, and the channel is ready. So every retry wait, Retry-After
// included, costs no real time; they are the only waits that follow this
// clock. Context deadlines, the drain and share limits (DefaultMaxDrainTime,
// DefaultMaxShareTime), OutcomeGrace, the journal timeout and lease polls run
// on real time.
type vclock struct {
	base   time.Time // true time 0: epoch, or the real start
	mu     sync.Mutex
	trueD  time.Duration // true time since epoch
	offset time.Duration // wall minus true
}

// Now is the wall time: what the Transport and the journals read.
func (c *vclock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start().Add(c.trueD + c.offset)
}

// TrueNow is true time, as the server and the checks read it.
func (c *vclock) TrueNow() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start().Add(c.trueD)
}

func (c *vclock) start() time.Time {
	if c.base.IsZero() {
		return epoch
	}
	return c.base
}

// trueSince is true time since the start.
func (c *vclock) trueSince() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trueD
}

// Offset is the wall clock's error: wall minus true.
func (c *vclock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}

// Advance lets d of true time pass.
func (c *vclock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.trueD += d
	c.mu.Unlock()
}

// SetOffset sets the wall clock's error: a clock set forward (d > 0) or
// back, without true time passing.
func (c *vclock) SetOffset(d time.Duration) {
	c.mu.Lock()
	c.offset = d
	c.mu.Unlock()
}

// NewTimer implements idemretry.Clock.
func (c *vclock) NewTimer() backoff.Timer { return &vtimer{c: c, ch: make(chan time.Time, 1)} }

type vtimer struct {
	c  *vclock
	ch chan time.Time
}

// Start fires the timer at once, d of true time later.
func (t *vtimer) Start(d time.Duration) {
	select {
	case <-t.ch:
	default:
	}
	t.c.Advance(d)
	t.ch <- t.c.Now()
}

func (t *vtimer) Stop() {
	select {
	case <-t.ch:
	default:
	}
}

func (t *vtimer) C() <-chan time.Time { return t.ch }
