package idemretry

import (
	"context"
	"errors"
	"fmt"
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
	f, err := t.holdFlight(ctx, listed)
	if err != nil {
		res.leave(err)
		return
	}
	confirmed := false
	defer func() {
		n := t.flights.land(f)
		if confirmed {
			// Outcome-unknown, as found: whoever joined is refused.
			f.fail(&ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true,
				Reason: ErrOutcomeUnknown})
			return
		}
		// Whoever joined carries the action on by itself.
		_, _ = f.share(listed.ActionID, n, 0, nil, nil, true)
	}()
	if err := t.stillUnknown(ctx, listed); err != nil {
		res.leave(err)
		return
	}
	// From here, a request of the action is refused at once.
	t.flights.holdForResolve(f, listed.Key)
	confirmed = true
	if until := t.settledAt(listed); t.earlierNow().Before(until) {
		res.leave(&ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true,
			Reason: ErrOutcomeUnknown, Err: fmt.Errorf("resolved only from %s, the settle time (WithSettleTime) after its key window: a request of it may still be processed until then", until.Format(time.RFC3339))})
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

// holdFlight makes Resume the leader of listed's flight in this Transport,
// waiting for a flight of it in the air to land first.
func (t *Transport) holdFlight(ctx context.Context, listed journal.Record) (*flight, error) {
	for {
		f, lead, mismatch := t.flights.join(listed.ActionID, listed.Fingerprint)
		switch {
		case lead:
			return f, nil
		case mismatch && !isKeyed(f.fp) && !isKeyed(listed.Fingerprint):
			// In flight with another payload: the id names another
			// action now.
			return nil, notResumableError(listed.ActionID, &listed, fmt.Errorf("a request of another payload is in flight"))
		}
		// In flight: with a keyed fingerprint, perhaps of the same payload
		// with another salt, which only the flight's request can tell.
		// Either way it lands first.
		if err := f.wait(ctx); err != nil {
			return nil, &ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true, Err: err}
		}
	}
}

// stillUnknown reads listed's record again, and returns nil if it is
// outcome-unknown under listed's key; a record that is gone (someone else
// reconciled it) is ErrNotResumable. A journal.Getter reads it without
// creating anything. Another journal is read with a Reserve, which creates
// a record that is gone: outcome-unknown, so that nothing is sent under its
// key, and forgotten again at once (a Forget that a crash, or another
// process's new record of the action in between, can defeat).
func (t *Transport) stillUnknown(ctx context.Context, listed journal.Record) error {
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	var cur journal.Record
	var created bool
	var err error
	if g, ok := t.journal.(journal.Getter); ok {
		var found bool
		cur, found, err = g.Get(jctx, listed.ActionID)
		if err == nil && !found {
			return notResumableError(listed.ActionID, &listed, fmt.Errorf("it was forgotten meanwhile"))
		}
	} else {
		want := listed
		want.State = journal.StateUnknown
		cur, created, err = t.journal.Reserve(jctx, want, journal.ReuseAny)
	}
	switch {
	case err != nil:
		return wrapf(journalError(ctx, err), "read action %q", listed.ActionID)
	case created:
		if err := t.journal.Forget(jctx, listed.ActionID); err != nil {
			err = wrapf(journalError(ctx, err), "forget action %q again", listed.ActionID)
			return notResumableError(listed.ActionID, &listed, err)
		}
		return notResumableError(listed.ActionID, &listed, fmt.Errorf("it was forgotten meanwhile"))
	case cur.Key != listed.Key:
		return notResumableError(listed.ActionID, &listed, nil)
	case cur.State != journal.StateUnknown:
		// Done (a request of it in the air got its answer): known, so
		// there is nothing to reconcile.
		return &ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: cur.Attempts, Status: cur.Status,
			MaybeProcessed: true, Reason: ErrNotResumable, Err: fmt.Errorf("its record is %s", cur.State)}
	}
	return nil
}

// leaseToResolve takes a's lease, kept renewed until releaseLease, or
// returns ErrLeaseHeld: another machine holds it, or the journal could not
// lease it (the lease is what says no other machine has a request of it in
// the air; a request goes on without one, a Resolve does not).
func (t *Transport) leaseToResolve(ctx context.Context, a *action) (bool, error) {
	lr := t.journal.(journal.Leaser) // t.leasing says it is one
	ttl := t.cfg.leaseTTLOrDefault()
	holder := t.leases.newHolder()
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
