package idemretry

import (
	"context"
	"fmt"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// reconcile hands the outcome-unknown action Resume listed to r.Resolve,
// and forgets it if Resolve says so, only while nothing else can send it
// or change its record: Resume leads the action's flight in this Transport
// (waiting for one in the air to land), holds its lease when the journal is
// a Leaser (another machine in flight with it: ErrLeaseHeld, left for the
// next Resume), and reads the record again before Resolve and before
// Forget. A record found done, or under another key, is not resolved: its
// outcome is known, or it is another action (ErrNotResumable). res.Err is
// Resolve's or the journal's error, or it is left as it was when the
// action is kept.
func (t *Transport) reconcile(ctx context.Context, r Resumer, listed journal.Record, res *ResumeResult) {
	f, err := t.holdFlight(ctx, listed)
	if err != nil {
		res.Err = err
		return
	}
	defer func() {
		// Whoever joined carries the action on by itself.
		n := t.flights.land(f)
		_, _ = f.share(listed.ActionID, n, 0, nil, nil, true)
	}()
	if err := t.stillUnknown(ctx, listed); err != nil {
		res.Err = err
		return
	}
	if t.leasing {
		a := &action{rec: listed}
		held, err := t.leaseToResolve(ctx, a)
		if err != nil {
			res.Err = err
			return
		}
		if held {
			defer t.releaseLease(a)
			// Another machine may have finished it before the lease.
			if err := t.stillUnknown(ctx, listed); err != nil {
				res.Err = err
				return
			}
		}
	}
	listed.State = journal.StateUnknown
	forget, err := r.Resolve(ctx, listed)
	if err != nil {
		res.Err = err
		return
	}
	if !forget {
		return
	}
	if err := t.stillUnknown(ctx, listed); err != nil {
		res.Err = err
		return
	}
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	if err := t.journal.Forget(jctx, listed.ActionID); err != nil {
		res.Err = wrapf(journalError(ctx, err), "forget action %q", listed.ActionID)
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
		case mismatch:
			// In flight with another payload: the id names another
			// action now.
			return nil, notResumableError(listed.ActionID, &listed, fmt.Errorf("a request of another payload is in flight"))
		}
		if err := f.wait(ctx); err != nil {
			return nil, err
		}
	}
}

// stillUnknown reads listed's record again, and returns nil if it is
// outcome-unknown under listed's key. A record forgotten meanwhile is
// created again so, under that key (see reserve).
func (t *Transport) stillUnknown(ctx context.Context, listed journal.Record) error {
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	want := listed
	want.State = journal.StateUnknown
	cur, _, err := t.journal.Reserve(jctx, want, journal.ReuseAny)
	switch {
	case err != nil:
		return wrapf(journalError(ctx, err), "read action %q", listed.ActionID)
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

// leaseToResolve takes a's lease, kept renewed until releaseLease: it
// reports false (and no error) when the journal cannot lease, as a request
// goes on then, and ErrLeaseHeld when another machine holds it.
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
		t.logLease(ctx, "idemretry: the journal did not lease the action; it is resolved without a lease", a, err)
		return false, nil
	case !held:
		return false, &ActionError{Action: a.rec.ActionID, Key: a.rec.Key, Attempts: a.rec.Attempts, MaybeProcessed: true,
			Reason: ErrLeaseHeld}
	}
	t.startLease(ctx, lr, a, holder, ttl, start)
	return true, nil
}
