package idemretry

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventAttempt: an attempt was sent and ended (Status, or Err), after
	// Elapsed.
	EventAttempt EventKind = iota + 1
	// EventRetry: a retry is scheduled, after Wait.
	EventRetry
	// EventDone: a final answer came back (Status); Replayed if the
	// server replayed a stored answer.
	EventDone
	// EventGiveUp: the attempts ended without a final answer. Reason is
	// ErrAttemptsExhausted, ErrRetryAfterTooLong or ErrWaitExceedsDeadline,
	// or nil when the caller's context or an error that is not retried
	// (Err) ended them. The action stays pending with its key.
	EventGiveUp
	// EventParked: the retry budget refused a retry (Reason ErrParked); the
	// action stays pending with its key.
	EventParked
	// EventUnknown: the action's outcome became unknown: its key window
	// ended (Reason ErrKeyWindowExpired) or the server refused its key as
	// used for another payload (ErrKeyReused). It must be reconciled.
	EventUnknown
	// EventResumed: Resume sent a pending action again.
	EventResumed
	// EventReserve: the journal's Reserve of an action's key returned,
	// after Elapsed (for a durable journal that created the record, its
	// write and sync, before the first attempt leaves). Action and Key are
	// empty.
	EventReserve
	// EventSync: a journal Sync the Transport asked for returned, after
	// Elapsed (the done of an action named by its fingerprint). Action and
	// Key are empty.
	EventSync
)

var eventNames = [...]string{"", "attempt", "retry", "done", "give-up", "parked", "unknown", "resumed", "reserve", "sync"}

// String returns the kind's name: "attempt", "retry", "done", ...
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k > 0 {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// An Event is something that happened to an action or its journal, for an
// Observer. It carries the action's id and key, never a request's body or
// headers.
type Event struct {
	Kind    EventKind
	Action  string // the action's id; empty for methods without a key
	Key     string // the key its attempts carry; empty without one
	Attempt int    // attempts of the action so far, in every run recorded
	// Requests is how many requests the attempt wrote (EventAttempt), as
	// Stats.Attempts counts them: one, or more when the base sent it
	// again by itself (net/http on a reused connection, a base that
	// retries).
	Requests int
	Status   int   // the last response's status, 0 if none
	Err      error // the last attempt's transport error, or nil
	Reason   error // why the attempts stopped (EventGiveUp, EventParked, EventUnknown)
	Wait     time.Duration
	Elapsed  time.Duration // how long the attempt, the Reserve or the Sync took
	// Replayed: the final answer was a replay of a stored one (EventDone).
	Replayed bool
}

// An Observer is told of every Event, synchronously, on the goroutine that
// runs the RoundTrip (or Resume): it must return quickly and be safe for
// concurrent use. A panicking Observer is the caller's bug; the Transport
// recovers it, logs it at Error with WithLogger, and goes on: an Observer
// cannot break a RoundTrip.
type Observer func(Event)

// WithObserver adds o to the Transport's observers; every observer sees
// every event, in the order they were added.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o != nil {
			c.observers = append(c.observers, o)
		}
	}
}

// Stats are the Transport's counters since it was made: a snapshot that
// Transport.Stats takes with atomic loads, safe to read concurrently.
type Stats struct {
	// Attempts counts the requests the base wrote (retries included, and
	// a base's own resends: what the server saw), and one for an attempt
	// that wrote nothing (a refused dial).
	Attempts int64
	Retries  int64 // retries scheduled
	Done     int64 // actions that got a final answer
	Replays  int64 // final answers that were replays
	// GiveUps counts actions whose attempts ended without a final answer:
	// by reason, and GiveUpsOther for the caller's context or an error
	// that is not retried.
	GiveUpsExhausted, GiveUpsRetryAfter, GiveUpsDeadline, GiveUpsOther int64

	Parked  int64 // retries refused by the retry budget
	Unknown int64 // actions whose outcome became unknown
	Resumed int64 // pending actions Resume sent again

	// Reserves counts the journal's key reservations (for a durable
	// journal, its write and sync before the first attempt leaves), and
	// ReserveTime is the time spent in them; Syncs and SyncTime count the
	// extra syncs the Transport asks for (the done of an action named by its
	// fingerprint).
	Reserves    int64
	ReserveTime time.Duration
	Syncs       int64
	SyncTime    time.Duration
}

// counters are Stats, kept with atomic adds.
type counters struct {
	attempts, retries, done, replays                            atomic.Int64
	giveUpsExhausted, giveUpsRetryAfter, giveUpsDeadline, other atomic.Int64
	parked, unknown, resumed, syncs, reserves                   atomic.Int64
	syncNanos, reserveNanos                                     timer
}

// timer is a total of nanoseconds (SyncTime, ReserveTime) to which each Add
// adds one operation's time: the Transport's observers hear of each
// (EventSync, EventReserve), to keep its latency's distribution.
type timer struct {
	nanos atomic.Int64
	kind  EventKind
	t     *Transport // whose observers hear of it
}

func (c *timer) Add(d int64) {
	c.nanos.Add(d)
	if t := c.t; t != nil && len(t.cfg.observers) > 0 {
		t.emit(context.Background(), Event{Kind: c.kind, Elapsed: time.Duration(d)})
	}
}

// init makes the timers tell t's observers.
func (c *counters) init(t *Transport) {
	c.syncNanos.kind, c.syncNanos.t = EventSync, t
	c.reserveNanos.kind, c.reserveNanos.t = EventReserve, t
}

// Stats returns a snapshot of the Transport's counters.
func (t *Transport) Stats() Stats {
	c := &t.counters
	return Stats{
		Attempts: c.attempts.Load(), Retries: c.retries.Load(), Done: c.done.Load(), Replays: c.replays.Load(),
		GiveUpsExhausted: c.giveUpsExhausted.Load(), GiveUpsRetryAfter: c.giveUpsRetryAfter.Load(),
		GiveUpsDeadline: c.giveUpsDeadline.Load(), GiveUpsOther: c.other.Load(),
		Parked: c.parked.Load(), Unknown: c.unknown.Load(), Resumed: c.resumed.Load(),
		Syncs: c.syncs.Load(), SyncTime: time.Duration(c.syncNanos.nanos.Load()),
		Reserves: c.reserves.Load(), ReserveTime: time.Duration(c.reserveNanos.nanos.Load()),
	}
}

// emit counts ev and tells the observers.
func (t *Transport) emit(ctx context.Context, ev Event) {
	c := &t.counters
	switch ev.Kind {
	case EventRetry:
		c.retries.Add(1)
	case EventDone:
		c.done.Add(1)
		if ev.Replayed {
			c.replays.Add(1)
		}
	case EventGiveUp:
		switch ev.Reason {
		case ErrAttemptsExhausted:
			c.giveUpsExhausted.Add(1)
		case ErrRetryAfterTooLong:
			c.giveUpsRetryAfter.Add(1)
		case ErrWaitExceedsDeadline:
			c.giveUpsDeadline.Add(1)
		default:
			c.other.Add(1)
		}
	case EventParked:
		c.parked.Add(1)
	case EventUnknown:
		c.unknown.Add(1)
	case EventResumed:
		c.resumed.Add(1)
	}
	for _, o := range t.cfg.observers {
		t.call(ctx, o, ev)
	}
}

// call runs one observer, recovering a panic.
func (t *Transport) call(ctx context.Context, o Observer, ev Event) {
	defer func() {
		if p := recover(); p != nil && t.cfg.logger != nil {
			t.cfg.logger.LogAttrs(ctx, slog.LevelError, "idemretry: observer panicked",
				slog.String("event", ev.Kind.String()), slog.Any("panic", p))
		}
	}()
	o(ev)
}

// synced counts a journal sync that took d.
func (t *Transport) synced(d time.Duration) {
	t.counters.syncs.Add(1)
	t.counters.syncNanos.Add(int64(d))
}
