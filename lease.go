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
// renewal is older than that), and releases it once RoundTrip has
// returned, in the background (see Transport.Close). A
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
	// leaseReleaseTimeout bounds a Release after a RoundTrip, and Close's
	// wait for the Releases under way: one that fails costs the other
	// machines at most the TTL, and this Transport nothing (see
	// leases.holderFor).
	leaseReleaseTimeout = time.Second
	// leasePollMin and leasePollMax bound the wait between two looks at a
	// lease held elsewhere; it doubles from the first to the second.
	leasePollMin = 50 * time.Millisecond
	leasePollMax = time.Second
)

// leases are the leases a Transport holds, by the action they lease, and
// the leases its RoundTrips have let go of that may still be held in the
// journal.
//
// A lease is released after its RoundTrip has returned, so that the
// caller's wait ends with its context (plus OutcomeGrace, for the outcome),
// whatever the journal does. A release that fails (the database was down
// when the RoundTrip ended) leaves the lease held in the journal until its
// TTL. This Transport then re-enters it: the lease names its holder, Lease
// renews a holder's own lease, and the next lease of the action from this
// Transport is taken under the name the release failed for (holderFor).
// The same process's resend therefore holds the lease at its first call
// that reaches the journal, with no wait. Retrying the release once the
// database is back would need a goroutine and a timer per failed release,
// stopped by Close, and would still lose the race to a resend that comes
// first; re-entering needs neither. Other machines wait for such a lease as
// for that of a machine that died holding one: until its TTL.
type leases struct {
	once sync.Once
	id   string // random, per Transport
	seq  atomic.Uint64
	mu   sync.Mutex
	held map[*action]*lease
	// left holds the leases whose RoundTrip has ended, by the digest form
	// of their action's id, while their release is under way and, once
	// it has failed, until they end by themselves (leftLease.until).
	left   map[string]*leftLease
	swept  time.Time // when left was last swept of leases that ended
	closed bool      // Close has begun: a release runs on the caller's path
	// releasing counts the releases under way, for Close.
	releasing sync.WaitGroup
}

// leftLease is a lease whose RoundTrip has ended. Its release is under way
// until done is closed; failed and until are set before that: the release
// failed, and the lease may be held in the journal under holder until, at
// the latest, until (on this machine's clock: twice the TTL after its last
// renewal, a margin for the journal's clock).
type leftLease struct {
	holder string
	done   chan struct{}
	failed bool
	until  time.Time
}

// holderFor returns the holder to lease action id under: the holder of a
// lease of this Transport's that it could not release, which re-enters
// that lease (see leases), or a new one. A release of the action under
// way is waited for first, bounded by ctx (and by the release's own
// bound, leaseReleaseTimeout).
func (ls *leases) holderFor(ctx context.Context, id string) string {
	key := journal.Digest(id)
	ls.mu.Lock()
	ll := ls.left[key]
	ls.mu.Unlock()
	if ll == nil {
		return ls.newHolder()
	}
	var deadline <-chan time.Time
	if dl, ok := ctx.Deadline(); ok && ctx.Done() == nil { // nothing else would end the wait at it
		timer := time.NewTimer(time.Until(dl))
		defer timer.Stop()
		deadline = timer.C
	}
	select {
	case <-ll.done:
	case <-ctx.Done():
		return ls.newHolder() // the Lease call that follows fails with ctx's error
	case <-deadline:
		return ls.newHolder()
	}
	if h, ok := ls.reenter(id); ok {
		return h
	}
	return ls.newHolder()
}

// reenter returns the holder of a lease of action id that this Transport
// could not release, if there is one that may still be held.
func (ls *leases) reenter(id string) (holder string, ok bool) {
	ls.mu.Lock()
	ll := ls.left[journal.Digest(id)]
	ls.mu.Unlock()
	if ll == nil {
		return "", false
	}
	select {
	case <-ll.done:
		return ll.holder, ll.failed && time.Now().Before(ll.until)
	default:
		return "", false // its release is under way
	}
}

// claim records that action id's lease is held under holder again: a lease
// left under that holder is this RoundTrip's now, not one to re-enter.
func (ls *leases) claim(id, holder string) {
	key := journal.Digest(id)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ll := ls.left[key]; ll != nil && ll.holder == holder {
		delete(ls.left, key)
	}
}

// leave records l, whose RoundTrip has ended, as left until its release
// has ended, and reports whether that release may run in the background
// (Close has not begun; it then counts in releasing).
func (ls *leases) leave(l *lease, ll *leftLease) (background bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.left == nil {
		ls.left = make(map[string]*leftLease)
	}
	if now := time.Now(); now.Sub(ls.swept) >= time.Second {
		ls.swept = now
		for key, old := range ls.left {
			select {
			case <-old.done:
				if !now.Before(old.until) {
					delete(ls.left, key)
				}
			default:
			}
		}
	}
	ls.left[journal.Digest(l.id)] = ll
	if !ls.closed {
		ls.releasing.Add(1)
	}
	return !ls.closed
}

// released records how ll's release went.
func (ls *leases) released(id string, ll *leftLease, failed bool, until time.Time) {
	key := journal.Digest(id)
	ls.mu.Lock()
	ll.failed, ll.until = failed, until
	if !failed && ls.left[key] == ll {
		delete(ls.left, key)
	}
	ls.mu.Unlock()
	close(ll.done)
}

// close makes later releases run on their caller's path, and waits for
// those under way in the background, each bounded by leaseReleaseTimeout.
func (ls *leases) close() {
	ls.mu.Lock()
	ls.closed = true
	ls.mu.Unlock()
	ls.releasing.Wait()
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
	lr              journal.Leaser
	id, key, holder string
	ttl             time.Duration
	ctx             context.Context // the RoundTrip's values, cancelled at release
	caller          context.Context // the RoundTrip's, for a release after Close
	stop            context.CancelFunc
	done            chan struct{} // closed when keep returns

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
	holder := t.leases.holderFor(ctx, a.rec.ActionID)
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
			t.logLease(ctx, "idemretry: the journal did not lease the action; it is sent without a lease", a.rec.ActionID, a.rec.Key, err)
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
		if h, ok := t.leases.reenter(a.rec.ActionID); ok {
			// Held by this Transport after all: a RoundTrip of the action
			// (whose flight this one joined) ended meanwhile, and its
			// release failed.
			holder = h
		}
		// Read the action again: the other machine may have finished it,
		// or its key window may have ended. The request is bound to the
		// action it reserved (its key): it arrived while that action was
		// in flight, so it is that action, even done, and never a new
		// payment the other machine made meanwhile under another key.
		again := who
		bound := a.rec // this action, under this key, or nothing
		again.bound = &bound
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
	l := &lease{lr: lr, id: a.rec.ActionID, key: a.rec.Key, holder: holder, ttl: ttl, ctx: lctx, caller: ctx, stop: stop,
		done: make(chan struct{}), renewed: start}
	t.leases.claim(l.id, holder)
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

// releaseLease stops renewing a's lease and releases it, after the
// RoundTrip has returned: in the background, bounded by
// leaseReleaseTimeout (and the journal timeout) whatever the caller's
// context, since a release cut short would leave the lease held for its
// TTL. Close waits for the releases under way; after Close a release runs
// on the caller's path, bounded by the caller's context as well. An error
// is logged only, and the lease is left for this Transport to
// re-enter (see leases).
func (t *Transport) releaseLease(a *action) {
	if a == nil || !t.leasing {
		return
	}
	l := t.leases.take(a)
	if l == nil {
		return
	}
	l.stop()
	ll := &leftLease{holder: l.holder, done: make(chan struct{})}
	if !t.leases.leave(l, ll) {
		// After Close: bounded by the caller's context too, which may
		// leave the lease to its TTL.
		jctx, cancel := t.journalContext(l.caller)
		defer cancel()
		t.release(jctx, l, ll)
		return
	}
	go func() {
		defer t.leases.releasing.Done()
		t.release(context.WithoutCancel(l.ctx), l, ll)
	}()
}

// release waits for l's renewals to end and releases l, unless another
// holder has taken it over, bounded by ctx, leaseReleaseTimeout and the
// journal timeout; it records how that went in ll.
func (t *Transport) release(ctx context.Context, l *lease, ll *leftLease) {
	<-l.done // its renewal under way, if any, ends with l.ctx
	l.mu.Lock()
	lost, renewed := l.lost, l.renewed
	l.mu.Unlock()
	var err error
	if !lost { // else not ours any more
		rctx, cancel := context.WithTimeout(ctx, min(t.cfg.journalTimeout, leaseReleaseTimeout))
		if err = l.lr.Release(rctx, l.id, l.holder); err != nil {
			t.logLease(rctx, "idemretry: the journal did not release the action's lease; it ends by itself, or is taken again by this Transport", l.id, l.key, err)
		}
		cancel()
	}
	t.leases.released(l.id, ll, err != nil, renewed.Add(l.ttl).Add(l.ttl)) // Add saturates
}

// logLease says at Warn that a lease call about action id, of key key,
// failed.
func (t *Transport) logLease(ctx context.Context, msg, id, key string, err error) {
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("action", id), slog.String("key", key), slog.Any("error", err))
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
