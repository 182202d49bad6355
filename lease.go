package idemretry

// This file keeps one machine in flight per action across a fleet: when
// the journal is a journal.Leaser (sqljournal's is), the leader of an
// action's flight leases the action before its first attempt, keeps the
// lease while it runs, and releases it when the RoundTrip ends. A machine
// that finds another one holding the lease waits for it instead of sending
// the same key alongside, which the server would answer with 409s.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	randv2 "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// DefaultLeaseTTL is how long an action's lease lasts unless renewed
// (WithLeaseTTL): a machine that dies holding one delays the action's
// resumption on the others by at most this much. A holder renews it every
// third of it while it runs.
const DefaultLeaseTTL = 30 * time.Second

var (
	// ErrLeaseHeld: another machine sharing the journal is sending the
	// action (it holds the action's lease, see journal.Leaser), and the
	// caller's context ended while this one waited for it. Nothing was sent
	// by this RoundTrip; the other machine may have performed the action.
	// The action stays as it is: resend it, and it keeps its key. From
	// Resume, about an outcome-unknown action: its lease was held, or could
	// not be taken, so Resolve was not asked; a later Resume will.
	ErrLeaseHeld = errors.New("idemretry: action in flight on another machine")
	// ErrLeaseLost: the action's lease passed to another machine while
	// this one was retrying it (its renewals failed for longer than the
	// lease lasts), so this one stopped before its next attempt, leaving
	// the action pending with its key.
	ErrLeaseLost = errors.New("idemretry: action taken over by another machine")
)

// WithLeaseTTL sets how long an action's lease lasts unless renewed
// (default DefaultLeaseTTL), when the journal is a journal.Leaser: how long
// the other machines wait for a machine that died sending an action before
// one of them takes it over. It is judged by the journal's storage clock.
// Zero restores the default; a negative value or one under a millisecond
// is invalid.
//
// With such a journal, the leader of an action's flight takes the action's
// lease after reserving its key and before its first attempt, renews it
// every third of the TTL while it runs (and before an attempt, if the last
// renewal is older than that), and releases it when RoundTrip ends. A
// RoundTrip that finds the lease held by another machine waits for it,
// polling with jitter and bounded by its context (else ErrLeaseHeld), then
// reads the action's record again and goes on with its key: the other
// machine may have finished it, and the server then replays its answer. A
// lease is for load, not for safety (the key already makes the server
// perform the action once): a Lease call that fails is logged at Warn and
// the action is sent without one. Lease waits are real time, whatever
// WithClock says.
func WithLeaseTTL(d time.Duration) Option { return func(c *config) { c.leaseTTL = d } }

func (c *config) leaseTTLOrDefault() time.Duration {
	if c.leaseTTL == 0 {
		return DefaultLeaseTTL
	}
	return c.leaseTTL
}

const (
	// leaseReleaseTimeout bounds a Release at the end of a RoundTrip: one
	// that fails costs the other machines at most the TTL.
	leaseReleaseTimeout = time.Second
	// leasePollMin and leasePollMax bound the wait between two looks at a
	// lease held elsewhere; it doubles from the first to the second.
	leasePollMin = 50 * time.Millisecond
	leasePollMax = time.Second
)

// leases are the leases a Transport holds, by the action they lease.
type leases struct {
	once sync.Once
	id   string // random, per Transport
	seq  atomic.Uint64
	mu   sync.Mutex
	held map[*action]*lease
}

// newHolder returns a holder name for one lease: the Transport's random id
// and a sequence number. Each RoundTrip's lease has its own, so that a
// RoundTrip's release cannot end the lease of the next one of the same
// action in this Transport.
func (ls *leases) newHolder() string {
	ls.once.Do(func() {
		var b [12]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic(err) // crypto/rand.Read does not fail (Go 1.24)
		}
		ls.id = "idemretry-" + hex.EncodeToString(b[:])
	})
	return ls.id + "-" + strconv.FormatUint(ls.seq.Add(1), 10)
}

func (ls *leases) put(a *action, l *lease) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.held == nil {
		ls.held = make(map[*action]*lease)
	}
	ls.held[a] = l
}

func (ls *leases) get(a *action) *lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.held[a]
}

func (ls *leases) take(a *action) *lease {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.held[a]
	delete(ls.held, a)
	return l
}

// lease is one RoundTrip's lease on its action.
type lease struct {
	lr         journal.Leaser
	id, holder string
	ttl        time.Duration
	ctx        context.Context // the RoundTrip's values, cancelled at release
	stop       context.CancelFunc
	done       chan struct{} // closed when keep returns

	mu      sync.Mutex
	renewed time.Time // when the last take or renewal that held began
	lost    bool      // another holder has it
}

// reserveLeased reserves the action named by who (see reserve) and, when
// the journal is a Leaser, leases it, waiting while another machine holds
// it. The lease is released by releaseLease.
func (t *Transport) reserveLeased(ctx context.Context, who identity, p payload, window time.Duration, dst *action) (*action, error) {
	a, err := t.reserve(ctx, who, p, window, dst)
	if err != nil || !t.leasing {
		return a, err
	}
	lr := t.journal.(journal.Leaser) // t.leasing says it is one
	ttl := t.cfg.leaseTTLOrDefault()
	holder := t.leases.newHolder()
	poll := leasePollMin
	waited := false // for another machine's lease to end
	for {
		jctx, cancel := t.journalContext(ctx)
		start := time.Now()
		held, until, err := lr.Lease(jctx, a.rec.ActionID, holder, ttl)
		cancel()
		switch {
		case err != nil && callerEnded(ctx):
			// The caller's context ended the call, not the journal:
			// nothing is sent after it.
			var reason error
			if waited {
				reason = ErrLeaseHeld // it was waiting for another machine
			}
			return nil, &ActionError{Action: a.rec.ActionID, Key: a.rec.Key, Attempts: a.rec.Attempts, Status: a.rec.Status,
				MaybeProcessed: true, Reason: reason, Err: err}
		case err != nil:
			t.logLease(ctx, "idemretry: the journal did not lease the action; it is sent without a lease", a, err)
			return a, nil
		case held:
			t.startLease(ctx, lr, a, holder, ttl, start)
			return a, nil
		}
		wait := min(untilPlus(until, time.Millisecond), poll/2+randv2.N(poll/2+1))
		poll = min(2*poll, leasePollMax)
		if dl, ok := ctx.Deadline(); ok && ctx.Done() == nil {
			wait = min(wait, time.Until(dl)) // nothing else would end the sleep at it
		}
		heldElsewhere := func(err error) error {
			return &ActionError{Action: a.rec.ActionID, Key: a.rec.Key, Attempts: a.rec.Attempts, Status: a.rec.Status,
				MaybeProcessed: true, Reason: ErrLeaseHeld, Err: err}
		}
		if err := sleepReal(ctx, max(wait, time.Millisecond)); err != nil {
			return nil, heldElsewhere(err)
		}
		if err := callerErr(ctx); err != nil {
			return nil, heldElsewhere(err)
		}
		waited = true
		// Read the action again: the other machine may have finished it,
		// or its key window may have ended. An action named by its
		// fingerprint keeps its key even if done (ReuseAny): it arrived
		// while the action was in flight, so it is that action, not a
		// deliberate repeat.
		again := who
		again.byFingerprint = false
		again.fp = a.rec.Fingerprint // ours, in the record's form: checked once
		next, err := t.reserve(ctx, again, p, window, dst)
		if err != nil {
			if callerEnded(ctx) {
				return nil, heldElsewhere(err) // still waiting for the other machine
			}
			return nil, err
		}
		a = next
		a.byFingerprint = who.byFingerprint
	}
}

// startLease records a lease taken at start and keeps it renewed until
// releaseLease.
func (t *Transport) startLease(ctx context.Context, lr journal.Leaser, a *action, holder string, ttl time.Duration, start time.Time) {
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := &lease{lr: lr, id: a.rec.ActionID, holder: holder, ttl: ttl, ctx: lctx, stop: stop,
		done: make(chan struct{}), renewed: start}
	t.leases.put(a, l)
	go t.keepLease(l)
}

// keepLease renews l every third of its TTL until it is released or lost.
func (t *Transport) keepLease(l *lease) {
	defer close(l.done)
	timer := time.NewTimer(l.ttl / 3)
	defer timer.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-timer.C:
		}
		if t.renewLease(l.ctx, l) {
			return
		}
		timer.Reset(l.ttl / 3)
	}
}

// renewLease renews l, bounded by ctx and the journal timeout, and reports
// whether it is lost. A renewal that fails changes nothing: the lease
// holds until its end all the same, and the next renewal may succeed.
func (t *Transport) renewLease(ctx context.Context, l *lease) (lost bool) {
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	start := time.Now()
	held, _, err := l.lr.Lease(jctx, l.id, l.holder, l.ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
	case held:
		if start.After(l.renewed) {
			l.renewed = start
		}
	default:
		l.lost = true
	}
	return l.lost
}

// checkLease is called before each attempt of a: it returns ErrLeaseLost
// if another machine has taken a's lease over, renewing it first if the
// last renewal is older than a third of the TTL (the renewals in the
// background failed, or were late).
func (t *Transport) checkLease(ctx context.Context, a *action) error {
	if !t.leasing {
		return nil
	}
	l := t.leases.get(a)
	if l == nil {
		return nil
	}
	l.mu.Lock()
	lost, age := l.lost, time.Since(l.renewed)
	l.mu.Unlock()
	if !lost && age >= l.ttl/3 {
		lost = t.renewLease(ctx, l)
	}
	if lost {
		return ErrLeaseLost
	}
	return nil
}

// releaseLease stops renewing a's lease and releases it, bounded by a short
// timeout (leaseReleaseTimeout, and the journal timeout) whatever the
// caller's context: a release cut short would leave the lease held, and
// the next request of the action, on this machine too, waiting for its
// TTL. An error is logged only.
func (t *Transport) releaseLease(a *action) {
	if a == nil || !t.leasing {
		return
	}
	l := t.leases.take(a)
	if l == nil {
		return
	}
	l.stop()
	<-l.done
	l.mu.Lock()
	lost := l.lost
	l.mu.Unlock()
	if lost {
		return // not ours any more
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), min(t.cfg.journalTimeout, leaseReleaseTimeout))
	defer cancel()
	if err := l.lr.Release(rctx, l.id, l.holder); err != nil {
		t.logLease(rctx, "idemretry: the journal did not release the action's lease; it ends by itself", a, err)
	}
}

// logLease says at Warn that a lease call failed.
func (t *Transport) logLease(ctx context.Context, msg string, a *action, err error) {
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("action", a.rec.ActionID), slog.String("key", a.rec.Key),
			slog.Any("error", err))
	}
}

// sleepReal waits d in real time, or until ctx is done: a lease ends by
// the storage's clock, not by the Transport's Clock.
func sleepReal(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
