package idemretry

import (
	"context"
	"errors"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// reconcile hands the outcome-unknown action Resume listed to r.Resolve,
// and forgets it if Resolve says so, only while nothing else can send it
// or change its record: Resume leads the action's flight in this Transport
// (waiting for one in the air to land; a request of it that arrives
// meanwhile is refused with ErrOutcomeUnknown), holds its lease when the
// journal is a Leaser (held by another machine, or not to be had: left for
// a later Resume, with ErrLeaseHeld), reads the record again before Resolve
// and before Forget, and waits until the settle time after its key window
// has passed (ErrOutcomeUnknown until then). A record found done, gone, or
// under another key, is not resolved: its outcome is known, or someone
// else reconciled it (ErrNotResumable). res.Err is the reason, or Resolve's
// or the journal's error, or it is left as it was when the action is kept.
func (t *Transport) reconcile(ctx context.Context, r Resumer, listed journal.Record, res *ResumeResult) {
	// A listed record that journal.CheckRecord refuses (a journal that
	// does not check what it reads back) is never resolved: Resolve asks
	// the provider about its key, which may not be the key the action was
	// sent under, and a "no charge" would have the app pay again.
	if err := journal.CheckStored(listed); err != nil {
		res.leave(wrapf(err, "resolve"))
		return
	}
	f, err := t.holdFlight(ctx, listed)
	if err != nil {
		res.leave(err)
		return
	}
	confirmed := false
	defer func() { t.unhold(f, listed, confirmed) }()
	if err := t.stillUnknown(ctx, listed); err != nil {
		res.leave(err)
		return
	}
	// From here, a request of the action is refused at once.
	t.flights.holdForResolve(f, listed.Key)
	confirmed = true
	if err := settled(listed, t.earlierNow(), t.cfg.keyWindow, t.cfg.settle); err != nil {
		res.leave(err)
		return
	}
	if t.leasing {
		a := &action{rec: listed}
		held, err := t.leaseToResolve(ctx, a)
		if err != nil {
			res.leave(err)
			return
		}
		if held {
			defer t.releaseLease(a)
			// Another machine may have finished it before the lease.
			if err := t.stillUnknown(ctx, listed); err != nil {
				res.leave(err)
				return
			}
		}
	}
	listed.State = journal.StateUnknown
	forget, err := r.Resolve(ctx, listed)
	if err != nil {
		res.leave(err)
		return
	}
	if !forget {
		return
	}
	if err := t.stillUnknown(ctx, listed); err != nil {
		res.leave(err)
		return
	}
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	if err := t.journal.Forget(jctx, listed.ActionID); err != nil {
		res.leave(wrapf(journalError(ctx, err), "forget action %q", listed.ActionID))
		return
	}
	res.Forgotten, res.Err = true, nil
}

// readListed reads listed's record again: found false if it is gone
// (someone reconciled it); one that journal.CheckRecord refuses is an
// error (journal.ErrCorruptRecord). A journal.Getter reads it without
// creating anything. Another journal is read with a Reserve, which creates a record
// that is gone: outcome-unknown, so that nothing is sent under its key,
// and forgotten again at once (a Forget that a crash, or another process's
// new record of the action in between, can defeat; one that fails is
// ErrNotResumable's cause).
func (t *Transport) readListed(ctx context.Context, listed journal.Record) (cur journal.Record, found bool, err error) {
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	if g, ok := t.journal.(journal.Getter); ok {
		cur, found, err = g.Get(jctx, listed.ActionID)
	} else {
		want := listed
		want.State = journal.StateUnknown
		var created bool
		cur, created, err = t.journal.Reserve(jctx, want, journal.ReuseAny)
		found = !created
		if err == nil && created {
			if err := t.journal.Forget(jctx, listed.ActionID); err != nil {
				err = wrapf(journalError(ctx, err), "forget action %q again", listed.ActionID)
				return cur, false, notResumableError(listed.ActionID, &listed, err)
			}
		}
	}
	if err == nil && found {
		err = journal.CheckStored(cur)
	}
	if err != nil {
		return cur, false, wrapf(journalError(ctx, err), "read action %q", listed.ActionID)
	}
	return cur, found, nil
}

// leaseToResolve takes a's lease, kept renewed until releaseLease, or
// returns ErrLeaseHeld: another machine holds it, or the journal could not
// lease it (the lease is what says no other machine has a request of it in
// the air; a request goes on without one, a Resolve does not).
func (t *Transport) leaseToResolve(ctx context.Context, a *action) (bool, error) {
	lr := t.journal.(journal.Leaser) // t.leasing says it is one
	ttl := t.cfg.leaseTTLOrDefault()
	holder := t.leases.holderFor(ctx, a.rec.ActionID) // lease.go: this Transport's own lease, re-entered
	jctx, cancel := t.journalContext(ctx)
	start := time.Now()
	held, _, err := lr.Lease(jctx, a.rec.ActionID, holder, ttl)
	cancel()
	switch {
	case err != nil:
		return false, &ActionError{Action: a.rec.ActionID, Key: a.rec.Key, Attempts: a.rec.Attempts, MaybeProcessed: true,
			Reason: ErrLeaseHeld, Err: journalError(ctx, err)}
	case !held:
		return false, &ActionError{Action: a.rec.ActionID, Key: a.rec.Key, Attempts: a.rec.Attempts, MaybeProcessed: true,
			Reason: ErrLeaseHeld}
	}
	t.startLease(ctx, lr, a, holder, ttl, start)
	return true, nil
}

// leave records why an action was left as it was: with the error the
// result already holds (the refusal that made it outcome-unknown), if any.
func (res *ResumeResult) leave(err error) {
	if res.Err == nil {
		res.Err = err
	} else {
		res.Err = errors.Join(res.Err, err)
	}
}
