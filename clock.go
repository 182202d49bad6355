package idemretry

// This file holds every time decision of the Transport: the clock, how old
// a key is, and when its window ends. Windows are wall-clock spans, as the
// server's key retention is. Keys minted by the current RoundTrip are aged
// monotonically from their minting; any other key by the best time known:
// the clock, or, when the journal keeps a never-backwards time
// (journal.Timekeeper) that is ahead of the clock by no more than
// maxClockLead, that time.

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry/journal"
)

// Clock is the Transport's source of time: it reads key windows from Now.
// A Clock that is also a TimerClock makes the timers the Transport waits on
// between attempts; the waits of any other run on the system's timers. The
// default is the system clock. A Clock must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// A TimerClock is a Clock that also makes the Transport's timers, so that a
// test or a simulation controls its waits as well as its time. A Clock
// written for earlier releases, whose NewTimer returns a
// cenkalti/backoff/v4 Timer, is used the same way. A Clock with a NewTimer
// method of any other signature is refused by NewTransport
// (ErrInvalidOption), rather than left waiting on the system's timers.
type TimerClock interface {
	Clock
	// NewTimer returns a stopped timer; the Transport Starts it for each wait.
	NewTimer() Timer
}

// A Timer is one of a TimerClock's timers. Its methods are those of
// cenkalti/backoff's Timer, so one fake serves both.
type Timer interface {
	// Start arms the timer to fire once, d from now; it is called again
	// for each wait.
	Start(d time.Duration)
	// Stop stops the timer; it is called after each wait.
	Stop()
	// C is the channel the timer fires on once started.
	C() <-chan time.Time
}

// timersOf returns the function that makes clk's timers: its NewTimer, or
// the system's for a Clock without one. ok is false for a NewTimer of
// another signature than TimerClock's (or the backoff/v4 form).
func timersOf(clk Clock) (newTimer func() Timer, ok bool) {
	switch c := clk.(type) {
	case TimerClock:
		return c.NewTimer, true
	case interface{ NewTimer() backoff.Timer }:
		return func() Timer { return c.NewTimer() }, true
	}
	if reflect.ValueOf(clk).MethodByName("NewTimer").IsValid() {
		return nil, false
	}
	return systemClock{}.NewTimer, true
}

type systemClock struct{}

func (systemClock) Now() time.Time  { return time.Now() }
func (systemClock) NewTimer() Timer { return &systemTimer{} }

// systemTimer is a Timer over time.Timer.
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

// now is the time key windows are judged by: the clock's, or, when the
// journal has seen a later time (it keeps a persisted high-water mark, see
// journal.Timekeeper) no more than maxClockLead ahead, that time. So a clock
// set back by up to maxClockLead cannot make a key look younger than it is;
// a mark further ahead was left by a clock that ran ahead and was corrected,
// and is not believed, as the journal's expiry does not believe it. Keys are
// created at the clock's time, so a mark ahead only ever makes keys look
// older: refused sooner, never sent later. (A key minted while the clock
// itself ran ahead looks younger than it is once the corrected clock has
// passed its creation, and nothing here can tell: README, guarantee 5.)
func (t *Transport) now() time.Time {
	now := t.cfg.clock.Now()
	if seen, ok := t.journalNow(); ok && seen.After(now) && seen.Sub(now) <= maxClockLead {
		return seen
	}
	return now
}

// earlierNow is the earlier of the clock and the journal's time
// (journal.Timekeeper), for the spans whose safe side is the short one: the
// settle time before Resolve, and the duplicate window in which a repeat of
// an unnamed payment is a tap. Neither a journal's time ahead of the clock
// (the file journal's high-water mark) nor a clock ahead of the journal's
// (sqljournal keeps the database's, by which a key's creation time is
// stored when the minter's clock runs ahead) may make them end early.
func (t *Transport) earlierNow() time.Time {
	now := t.cfg.clock.Now()
	if seen, ok := t.journalNow(); ok && seen.Before(now) {
		return seen
	}
	return now
}

// journalNow returns the journal's never-backwards time, if it keeps one.
func (t *Transport) journalNow() (time.Time, bool) {
	if jc, ok := t.journal.(journal.Timekeeper); ok {
		return jc.Now(), true
	}
	return time.Time{}, false
}

const (
	// maxClockSkew is how far in the future a key's creation may lie (the
	// clocks of a fleet disagree a little) before it counts as made by a
	// clock that has been set back since: ErrClockSkew.
	maxClockSkew = time.Minute
	// maxClockLead is how far ahead of the clock the journal's time is
	// believed; the file journal's expiry uses the same bound.
	maxClockLead = journal.DefaultGrace
)

// windowEndsFor reports whether the key window of a is over d from now. A
// key minted by this RoundTrip is aged by the clock since then (monotonic on
// the system clock); any other by the best time known (see now).
func (t *Transport) windowEndsFor(a *action, d time.Duration) bool {
	if a.fresh {
		return sincePlus(t.cfg.clock.Now(), a.createdAt, d) >= a.window
	}
	return windowEnds(a.rec, t.now(), d, a.window)
}

// windowEnds reports whether the key window of rec is over at now+d.
func windowEnds(rec journal.Record, now time.Time, d, window time.Duration) bool {
	return !now.Add(d).Before(rec.CreatedAt.Add(window))
}

// logClock warns when the clock is behind times the journal has seen (it
// was set back): key windows are then judged by the journal's time, up to
// maxClockLead ahead.
func (t *Transport) logClock() {
	seen, ok := t.journalNow()
	now := t.cfg.clock.Now()
	if t.cfg.logger == nil || !ok || !now.Before(seen.Add(-maxClockSkew)) || seen.Sub(now) > maxClockLead {
		return
	}
	t.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn,
		"idemretry: the clock is behind times the journal has seen; key windows are judged by the journal's time",
		slog.Time("clock", now), slog.Time("journal", seen))
}
