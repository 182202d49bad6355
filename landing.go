package idemretry

// This file writes to the journal from the request path: every wait
// bounded, and outcomes the journal could not take kept in memory until
// they land.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// OutcomeGrace is how long past the end of the caller's context RoundTrip
// still waits for the journal to record the outcome it is about to return
// (a final answer that arrived just as the deadline passed must be recorded
// as done, or a deliberate repeat would be answered with its replay). Every
// other journal wait on the request path ends with the caller's context
// (the action's lease, journal.Leaser, is released after RoundTrip
// returns), and none lasts longer than the journal timeout
// (WithJournalTimeout).
const OutcomeGrace = 250 * time.Millisecond

// outcomeContext bounds a journal write that records an outcome: it is not
// cancelled with the caller's context (the answer is in hand and must be
// recorded), but ends OutcomeGrace after the caller's context ends (its
// deadline, or a cancel), or after the journal timeout, whichever is first.
// A caller's context that can neither be cancelled nor expire leaves the
// journal timeout alone to bound it: a shared bound (journaltimeout.go).
func (t *Transport) outcomeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if t.journalNeverWaits() {
		return withoutCancel(ctx), func() {}
	}
	d := t.cfg.journalTimeout
	_, hasDeadline := ctx.Deadline()
	switch {
	case callerEnded(ctx):
		return context.WithTimeout(withoutCancel(ctx), graceAfter(ctx, d))
	case ctx.Done() == nil && !hasDeadline && shareable(d):
		// Bounded by the journal timeout alone: a shared bound.
		return t.timeouts.bound(ctx, d), func() {}
	case ctx.Done() == nil:
		return context.WithTimeout(withoutCancel(ctx), graceAfter(ctx, d))
	}
	// The caller's context can still be cancelled, before its deadline if
	// it has one: the write then ends OutcomeGrace after the cancel.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), graceAfter(ctx, d))
	stop := context.AfterFunc(ctx, func() {
		grace := time.NewTimer(OutcomeGrace)
		defer grace.Stop()
		select {
		case <-grace.C:
			cancel()
		case <-wctx.Done():
		}
	})
	return wctx, func() {
		stop()
		cancel()
	}
}

// graceAfter returns d, cut to what is left of ctx plus OutcomeGrace: the
// bound of a write that may outlast the caller's context, but not by more.
func graceAfter(ctx context.Context, d time.Duration) time.Duration {
	if callerEnded(ctx) {
		return min(d, OutcomeGrace)
	}
	if dl, ok := ctx.Deadline(); ok {
		return min(d, untilPlus(dl, OutcomeGrace))
	}
	return d
}

// callerEnded reports whether the caller's ctx has ended: cancelled, or
// past its deadline (which a context without a Done channel cannot report
// through Err).
func callerEnded(ctx context.Context) bool { return callerErr(ctx) != nil }

// callerErr is why the caller's ctx ended, or nil: its Err, or
// context.DeadlineExceeded for a context without a Done channel past its
// deadline.
func callerErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && ctx.Done() == nil && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// journalContext bounds a journal call made before sending: by the caller's
// context and the journal timeout. A caller's context whose deadline comes
// before the journal timeout would end is already that bound: no context
// and timer are made for it. A context that reports a deadline but has no
// Done channel (a broken one: nothing can tell a wait that its deadline
// came) bounds nothing, and the journal call gets a timer of its own, at
// the earlier of the two. A context with neither a deadline nor a Done
// channel gets a shared bound (journaltimeout.go).
func (t *Transport) journalContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if t.journalNeverWaits() {
		return ctx, func() {}
	}
	dl, ok := ctx.Deadline()
	switch {
	case !ok && ctx.Done() == nil && shareable(t.cfg.journalTimeout):
		// Nothing but the journal timeout bounds the call: a shared
		// bound (journaltimeout.go).
		return t.timeouts.bound(ctx, t.cfg.journalTimeout), func() {}
	case !ok:
		return context.WithTimeout(ctx, t.cfg.journalTimeout)
	case ctx.Done() == nil:
		// context.WithTimeout would trust the deadline and arm no timer.
		return context.WithTimeout(context.WithoutCancel(ctx), min(time.Until(dl), t.cfg.journalTimeout))
	case time.Until(dl) <= t.cfg.journalTimeout:
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, t.cfg.journalTimeout)
}

// journalNeverWaits reports that the journal says its calls never block
// (journal.NonBlocker, as journal.Memory does, but not a journal that
// embeds one): the journal timeout cannot
// cut one short, so no timer is armed for it. A timeout under a
// millisecond keeps its timer: one could end before the call even starts.
func (t *Transport) journalNeverWaits() bool {
	return t.journalNonBlocking && t.cfg.journalTimeout >= time.Millisecond
}

// neverBlocks reports whether j says its calls never block.
func neverBlocks(j journal.Journal) bool {
	nb, ok := j.(journal.NonBlocker)
	return ok && nb.NeverBlocks(j)
}

// withoutCancel is context.WithoutCancel, without the allocation for a
// context that can never be cancelled and has no deadline (no Done
// channel): such a context is already what WithoutCancel would make of it.
func withoutCancel(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		if _, ok := ctx.Deadline(); !ok {
			return ctx
		}
	}
	return context.WithoutCancel(ctx)
}

// journalError reports a journal call that did not complete: one cut short
// by the journal timeout (not by the caller) means the journal is
// unavailable. ctx is the caller's: its deadline ended the call when it
// has passed, even on a context that cannot say so through Err (one with a
// deadline and no Done, which journalContext times itself).
func journalError(ctx context.Context, err error) error {
	if callerEnded(ctx) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, journal.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", journal.ErrUnavailable, err)
}

// record stores an action's outcome: done or unknown. A write that fails is not reported to
// the caller (the response in hand is still right), but an outcome (done or
// unknown) that did not reach the journal is kept in memory and written
// before the next Reserve of the action, which fails while it cannot be: a
// journal left saying "pending" for a done action would give a deliberate
// repeat the old key, and the old payment's replay. durable asks for the
// outcome to be synced too (see journal.Syncer).
func (t *Transport) record(ctx context.Context, rec journal.Record, durable bool) {
	wctx, cancel := t.outcomeContext(ctx)
	defer cancel()
	err := t.write(wctx, rec, durable)
	if err == nil || errors.Is(err, journal.ErrNotFound) {
		t.unlanded.drop(rec)
		return
	}
	t.unlanded.keep(rec, durable)
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: journal did not record an outcome; it is kept in memory and written before the action is sent again",
			slog.String("action", rec.ActionID), slog.String("key", rec.Key), slog.String("state", rec.State.String()),
			slog.Int("status", rec.Status), slog.Any("error", err))
	}
}

// progress records an attempt count, bounded by the caller's context: it is
// not an outcome, and losing it costs at most a recount.
func (t *Transport) progress(ctx context.Context, rec journal.Record) {
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	_ = t.journal.Update(jctx, rec)
}

func (t *Transport) write(ctx context.Context, rec journal.Record, durable bool) error {
	if err := t.journal.Update(ctx, rec); err != nil {
		return err
	}
	if s, ok := t.journal.(journal.Syncer); ok && durable {
		start := time.Now()
		err := s.Sync(ctx)
		t.synced(time.Since(start))
		return err
	}
	return nil
}

// landOutcome writes the outcome of action id that an earlier RoundTrip
// could not, before the action is reserved again. The write is bounded by
// jctx (the caller's ctx with the journal timeout); an error is judged
// against ctx, so that one the timeout caused says the journal is
// unavailable.
func (t *Transport) landOutcome(ctx, jctx context.Context, id string) error {
	u, ok := t.unlanded.get(id)
	if !ok {
		return nil
	}
	err := t.write(jctx, u.rec, u.durable)
	if err == nil || errors.Is(err, journal.ErrNotFound) {
		t.unlanded.drop(u.rec)
		return nil
	}
	return wrapf(journalError(ctx, err), "action %q: its last outcome (%v, status %d) is not yet in the journal, so it is not sent again",
		id, u.rec.State, u.rec.Status)
}

// landAll writes every outcome still held in memory, for Close.
func (t *Transport) landAll() error {
	var errs []error
	for _, u := range t.unlanded.all() {
		jctx, cancel := context.WithTimeout(context.Background(), t.cfg.journalTimeout)
		err := t.landOutcome(context.Background(), jctx, u.rec.ActionID)
		cancel()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unlanded holds outcomes the journal has not accepted yet, by the digest
// form of their action ids (journal.Digest): a Resume on a journal that
// hashes ids names an action by its digest, a live request by its id, and
// both must find an outcome the other holds, as they share its flight.
type unlanded struct {
	mu sync.Mutex
	m  map[string]unlandedRecord
	// n is len(m), so that the request path, which nearly always finds
	// nothing, need not take mu: an outcome kept for an action is kept
	// before its flight lands (flights.mu orders it before the action's
	// next RoundTrip looks).
	n atomic.Int32
}

type unlandedRecord struct {
	rec     journal.Record
	durable bool
}

func (u *unlanded) keep(rec journal.Record, durable bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = make(map[string]unlandedRecord)
	}
	u.m[journal.Digest(rec.ActionID)] = unlandedRecord{rec, durable}
	u.n.Store(int32(len(u.m)))
}

func (u *unlanded) get(id string) (unlandedRecord, bool) {
	if u.n.Load() == 0 {
		return unlandedRecord{}, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	r, ok := u.m[journal.Digest(id)]
	return r, ok
}

// drop forgets rec's outcome, if it is the one held.
func (u *unlanded) drop(rec journal.Record) {
	if u.n.Load() == 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	d := journal.Digest(rec.ActionID)
	if r, ok := u.m[d]; ok && r.rec.Key == rec.Key {
		delete(u.m, d)
		u.n.Store(int32(len(u.m)))
	}
}

func (u *unlanded) all() []unlandedRecord {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]unlandedRecord, 0, len(u.m))
	for _, r := range u.m {
		out = append(out, r)
	}
	return out
}
