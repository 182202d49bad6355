package idemretry

// This file is the home of an action's lifecycle: its states, and every
// decision that moves a keyed request from one to the next. The other
// files do the work: identify names the action, mintWant and
// reserveRecord reserve its key (reserve.go), reserveLeased leases it
// (lease.go), attempts sends and classifies (attempt.go, outcome.go), join,
// land and copyBody carry a flight (flight.go), record writes an outcome
// (landing.go).
//
// # The action, in the journal
//
// An action's record moves only forward, as a Stripe idempotency key moves
// between recovery points (started, ..., finished); a done record is
// replaced by a new action, never reopened:
//
//	absent  -> pending   reserve: a key (the request's own, adopted, else a
//	                     new one), durable before the first attempt; every
//	                     later request of the action goes out under it,
//	                     whatever key it carries
//	pending -> done      a final answer (the RetryPolicy's call, in attempts)
//	pending -> unknown   its key window ended (judge, or between attempts), or
//	                     the server refused its key as reused
//	done    -> pending   an unnamed request that is a new payment (repeatOf false):
//	                     a new key replaces the record
//	unknown -> absent    Forget, once Resolve has reconciled it (Resume: only
//	                     settled, still unknown under its key, its flight held)
//
// Done is final: nothing that comes later (a failed resend, a replay)
// changes a done record.
//
// # A request of it, in this Transport
//
// A keyed request, once identified, boards its action's flight (board):
//
//	identified -> leading   no flight of the action in the air: it starts one
//	identified -> joined    a flight is in the air: it waits for it to land
//	identified -> refused   the flight is Resume's, resolving the action (ErrOutcomeUnknown),
//	                        or carries another payload (ErrFingerprintMismatch)
//
// A leader reserves (reserve: new or repeat, then judge: sent or refused),
// makes its attempts, lands the flight (no request joins it after that)
// and hands its result to its joiners (hand):
//
//	leading -> shared       its joiners take a copy of its answer (or its error)
//	leading -> handed over  it stopped for its own context before its joiners had
//	                        the answer: they go again, bound to its action (carryOn)
//	leading -> not shared   the body is over WithMaxSharedResponse, failed to read,
//	                        or is a 101's upgraded connection: ErrResponseNotShared
//
// A joiner, once its flight has landed, takes the result only if the
// flight's action is one it would itself have reserved when it arrived
// (landed; hopOnArrival for a done 307/308): else (an unnamed payment made
// after the flight's action was done, past the duplicate window and its
// hop) it goes again. The joiners that go again, and the requests that
// arrive while they wake, are one tap: they go on in one flight, which is
// in the air from the landing on (land, heir), so that none that wakes late
// finds another's payment of the tap done and makes a second.
//
// Resume leads an outcome-unknown action's flight without sending
// (holdFlight) while it resolves it: a request that joins is refused
// with ErrOutcomeUnknown once the record is confirmed unknown, and goes
// again if it is not (unhold).
//
// The decisions are functions of what was found and when, so that each
// has a table (lifecycle_test.go, reserve_test.go): repeatOf and repeats
// (new or repeat), boundTo (Resume's and a carrying joiner's one action),
// judge (sent or refused), landed (take, go again, carry on), handsOver
// and hand (shared, handed over, not shared), stillUnknown and settled
// (resolve or not).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// fly carries the keyed request req, whose action is who's, through its
// lifecycle: it boards the action's flight, then leads it or, joined,
// takes its result or goes again (see landed).
func (t *Transport) fly(req *http.Request, b *body, who identity, s settings) (*http.Response, error) {
	ctx := req.Context()
	if who.byFingerprint && who.exact() == "" {
		who.arrived = t.cfg.clock.Now()
		if kept, ok := t.journalNow(); ok {
			who.arrivedKept = kept
			if kept.Before(who.arrived) {
				who.arrived = kept // earlierNow
			}
		}
	}
	f, lead, err := t.board(payload{req, b}, &who)
	for {
		if err != nil {
			return nil, err
		}
		if lead {
			return t.lead(req, b, who, f, s)
		}
		var arrived time.Time
		var hopLive bool
		if arrived, hopLive, err = t.await(ctx, f, &who); err != nil {
			return nil, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Err: err}
		}
		v := landed(&who, f, arrived, hopLive, t.cfg.duplicateWindow)
		if v == takeResult && f.asker != who.asker {
			// The answer is to another principal's request (another
			// tenant's key, or a token refreshed between two taps): the
			// request is not given it, and goes as a request of the
			// flight's action, under its key, with its own credentials
			// (the server judges them), or, none sent, of its own.
			v = goAgain
			if f.acting {
				v = carryOn
			}
		}
		switch v {
		case takeResult:
			t.flights.decide(f)
			return f.result()
		case carryOn:
			t.flights.decide(f)
			bound := f.act.rec
			who.bound = &bound
			f, lead, err = t.board(payload{req, b}, &who)
		default: // goAgain: with the others of f's joiners that do, one tap
			g, gl := t.flights.heir(ctx, f, who.asker)
			switch {
			case g == nil:
				f, lead, err = t.board(payload{req, b}, &who)
			case !gl && t.flights.reconciling(g):
				// Resume holds it while the app resolves the action:
				// refused at once, as board refuses.
				t.flights.decide(g)
				return nil, &ActionError{Action: who.id, Key: t.flights.keyOf(g), MaybeProcessed: true, Reason: ErrOutcomeUnknown}
			default:
				f, lead = g, gl
			}
		}
	}
}

// await waits, for who's request, joined to flight f, until f lands, and
// returns when the request arrived and whether f's action, a done 307/308,
// had its hop unfinished then (hopOnArrival). A request whose ctx ends
// first gets its error; it, or a panic on the way (in the app's Clock, in
// the journal), counts the request out of f (decide), so that no flight
// counts a caller that went.
func (t *Transport) await(ctx context.Context, f *flight, who *identity) (arrived time.Time, hopLive bool, err error) {
	landed := false
	defer func() {
		if !landed {
			t.flights.decide(f) // flight.go: no copy is made for it
		}
	}()
	if arrived = who.arrived; arrived.IsZero() {
		arrived = t.earlierNow()
	}
	hopLive, judged := t.hopOnArrival(ctx, f, who)
	if err = t.flights.wait(ctx, f); err != nil {
		return arrived, false, err
	}
	landed = true
	if !judged {
		hopLive = f.hopTap // f reserved after the request arrived
	}
	return arrived, hopLive, nil
}

// board finds who's flight: the one in the air, which it joins, or a new
// one, which it leads. A flight whose fingerprint is of another form (a
// keyed one, with a salt of its own) is compared with the request's in
// that form; one of another payload refuses it, and so does a flight held
// by Resume while the app resolves the action (it is outcome-unknown, and
// nothing of it is sent).
func (t *Transport) board(p payload, who *identity) (f *flight, lead bool, err error) {
	for {
		f, lead, mismatch := t.flights.join(who.id, who.fp, who.asker, true)
		switch {
		case mismatch:
			fp, same, err := t.samePayload(p, who, f.fp)
			if err != nil { // the body read again, or a keyed fingerprint that cannot be checked
				return nil, false, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Err: err}
			}
			if !same {
				return nil, false, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Reason: ErrFingerprintMismatch}
			}
			who.fp = fp
			continue
		case !lead && t.flights.reconciling(f):
			t.flights.decide(f) // counted as joined: counted out
			return nil, false, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Reason: ErrOutcomeUnknown}
		}
		return f, lead, nil
	}
}

// lead makes the flight's attempts and hands their result to the callers
// that joined (hand). A panic (in a policy, a hook, the journal) still
// lands the flight, so that its joiners and later requests are not
// stranded.
func (t *Transport) lead(req *http.Request, b *body, who identity, f *flight, s settings) (resp *http.Response, err error) {
	landed := false
	defer func() {
		if !landed {
			t.flights.land(f)
			f.fail(fmt.Errorf("idemretry: the request leading action %q panicked", who.id))
		}
	}()
	who.flight = f
	var pending bool
	a, err := t.reserveLeased(req.Context(), who, payload{req, b}, s.keyWindow, &f.act) // lease.go: one machine in flight per action
	defer t.releaseLease(a)
	if err == nil {
		f.acting = true
		t.flights.setKey(f, a.rec.Key)
		resp, pending, err = t.attempts(req, b, a, s, &f.trace)
	}
	n := t.flights.land(f)
	landed = true
	return t.hand(req, f, &who, n, resp, err, pending)
}

// reserve reserves the key of the action named by who, durably, and
// returns dst set to it. It sends nothing. Only the leader of the action's
// flight calls it (lead, through reserveLeased), so calls for one action
// never overlap within a Transport. New or repeat: the record found is
// who's action if repeatOf says so, else a new one replaces it (under
// journal.ReusePending); a request bound to one action must find that one
// (boundTo); a repeat is sent or refused by reserveRepeat.
func (t *Transport) reserve(ctx context.Context, who identity, p payload, window time.Duration, dst *action) (*action, error) {
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	if err := t.landOutcome(ctx, jctx, who.id); err != nil {
		return nil, err
	}
	if who.resumed != nil {
		if err := t.stillListed(ctx, jctx, who.id, &who.resumed.rec); err != nil {
			return nil, err
		}
	}
	want, err := t.mintWant(&who)
	if err != nil {
		return nil, err
	}
	rec, created, err := t.reserveRecord(jctx, want, journal.ReuseAny)
	var hopTap bool // rec is done, and a tap of it only for its unfinished hop
	if err == nil && !created {
		var same bool
		if same, hopTap, err = t.repeatOf(jctx, &who, rec); err == nil && !same {
			rec, created, err = t.reserveRecord(jctx, want, journal.ReusePending)
		}
	}
	if err != nil {
		return nil, wrapf(journalError(ctx, err), "reserve key for action %q", who.id)
	}
	if who.syncDone && !who.byFingerprint && who.resumed == nil {
		t.hops.add(who.id) // a live 307/308 hop of an unnamed payment (redirecthop.go)
	}
	if err := t.boundTo(ctx, &who, rec, created); err != nil {
		return nil, err // found nothing that is the flight's: its joiners go again (handsOver)
	}
	if who.flight != nil {
		t.flights.noteFound(who.flight, rec, hopTap) // whom the flight may take in (landed)
	}
	if created && who.exact() == "" {
		// A key minted just now: its age is measured from its creation
		// (on the system clock, monotonically), never inferred, so no
		// clock disagreement can refuse it. Its record counts the first
		// attempt already (mintWant): that one is this RoundTrip's to
		// count, none came before it.
		rec.Attempts = 0
		*dst = action{rec: rec, fresh: true, createdAt: want.CreatedAt, byFingerprint: who.byFingerprint, syncDone: who.syncDone, window: window, resumed: who.resumed}
		return dst, nil
	}
	return t.reserveRepeat(ctx, &who, p, rec, window, dst)
}

// reserveRepeat returns dst set to rec, the existing record of who's
// action, if the request is its payload (checkPayload) and judge lets it
// be sent, under rec's key, whatever key the request carries (keyReplaced);
// a pending action refused as past its key window is recorded
// outcome-unknown (expire).
func (t *Transport) reserveRepeat(ctx context.Context, who *identity, p payload, rec journal.Record, window time.Duration, dst *action) (*action, error) {
	now := t.now()
	if err := t.checkPayload(p, who, rec, now, window); err != nil {
		return nil, err
	}
	if reason := judge(rec, now, window); reason != nil {
		if reason == ErrKeyWindowExpired && rec.State == journal.StatePending {
			t.expire(ctx, who, rec)
		}
		return nil, refusal(who.id, rec, reason)
	}
	t.keyReplaced(ctx, who, rec)
	*dst = action{rec: rec, byFingerprint: who.byFingerprint, syncDone: who.syncDone, window: window, resumed: who.resumed}
	return dst, nil
}

// repeatOf reports whether a request named by who is a request of the
// action rec records (found by reserving who's id): always, for a named
// action (a caller key, a WithAction id: one id is one action for its
// whole key window) and for a request bound to rec's action; for an
// unnamed one, unless rec is done past the duplicate window (repeats, at
// the request's arrival: identity.arrived) and
// was not answered with a 307/308 whose hop is still unfinished (then the
// action is not finished, and the request is a tap of it, which goes out
// under its key and joins its hop: viaHop).
func (t *Transport) repeatOf(ctx context.Context, who *identity, rec journal.Record) (same, viaHop bool, err error) {
	arrived := who.arrived
	if arrived.IsZero() {
		arrived = t.earlierNow()
	}
	if !who.byFingerprint || who.exact() != "" || who.repeatsOnArrival(rec, arrived, t.cfg.duplicateWindow) {
		return true, false, nil
	}
	same, err = t.hopUnfinished(ctx, rec)
	return same, same, err
}

// hopOnArrival judges, for a request named by who that has just joined
// flight f, whether f's action is a done 307/308 whose hop is unfinished
// now, as the request arrives (repeatOf's viaHop, as its own reservation
// would judge it now): not judged (judged false) when f has not reserved
// yet, as f's reservation, made after the request arrived, then tells
// (flight.hopTap), or when the journal does not answer (f's verdict
// stands); false when f's reservation found no such action.
func (t *Transport) hopOnArrival(ctx context.Context, f *flight, who *identity) (live, judged bool) {
	if !who.byFingerprint || who.exact() != "" {
		return false, true // named, or bound: it takes f's action whatever its hop
	}
	key, hopTap, reserved := t.flights.hopFound(f)
	switch {
	case !reserved:
		return false, false
	case !hopTap:
		return false, true
	}
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	// hopTap says the record was done with a 307 or a 308: hopUnfinished
	// treats the two alike.
	live, err := t.hopUnfinished(jctx, journal.Record{Key: key, State: journal.StateDone, Status: http.StatusTemporaryRedirect})
	if err != nil {
		return false, false
	}
	return live, true
}

// repeats reports whether an unnamed request made at now repeats the
// action rec records, rather than starting a new one: while rec is not
// done, and within the duplicate window (WithDuplicateWindow, none by
// default) of its creation.
func repeats(rec journal.Record, now time.Time, duplicateWindow time.Duration) bool {
	return rec.State != journal.StateDone || (duplicateWindow > 0 && now.Before(rec.CreatedAt.Add(duplicateWindow)))
}

// repeatsOnArrival is repeats for who's unnamed request, which arrived at
// arrived: and a done action made after the request arrived is not one it
// repeats, however it is found later (another payment, made while the
// request waited), when the journal keeps a time that never goes back
// (journal.Timekeeper; its reading at the arrival, identity.arrivedKept)
// to tell so by, beyond maxClockSkew (a fleet's clocks disagree a
// little). Without one, the wall clock cannot tell an action made later
// from a clock set back since: the request is taken for a tap, the safe
// side of the window.
func (who *identity) repeatsOnArrival(rec journal.Record, arrived time.Time, duplicateWindow time.Duration) bool {
	if !repeats(rec, arrived, duplicateWindow) {
		return false
	}
	return rec.State != journal.StateDone || who.arrivedKept.IsZero() || !rec.CreatedAt.After(who.arrivedKept.Add(maxClockSkew))
}

// exact returns the key of the one action who is bound to (Resume's listed
// record, or the action of a flight it joined and carries on), or "".
func (who *identity) exact() string {
	switch {
	case who.resumed != nil:
		return who.resumed.rec.Key
	case who.bound != nil:
		return who.bound.Key
	}
	return ""
}

// boundTo checks that a request bound to one action reserved that action:
// Resume's request is sent under its listed key or not at all
// (ErrNotResumable; a record created just now, as the listed one was
// forgotten, is outcome-unknown: handed to Resolve); a joiner carrying its
// flight's action on finds it under its key, or, the action replaced since
// by a new one, it gives up with ErrResponseNotShared (its answer was the
// replaced action's). A record created for a joiner (the action was
// forgotten meanwhile) is that action again, under its key.
func (t *Transport) boundTo(ctx context.Context, who *identity, rec journal.Record, created bool) error {
	switch {
	case who.resumed != nil && (created || rec.Key != who.resumed.rec.Key):
		if created {
			who.resumed.unknown.Store(true)
			t.logUnknown(ctx, rec, ErrNotResumable)
			t.emit(ctx, Event{Kind: EventUnknown, Action: who.id, Key: rec.Key, Attempt: rec.Attempts, Reason: ErrNotResumable})
		}
		return notResumableError(who.id, &who.resumed.rec, nil)
	case who.bound != nil && rec.Key != who.bound.Key:
		b := who.bound
		return &ActionError{Action: who.id, Key: b.Key, Attempts: b.Attempts, Status: b.Status, MaybeProcessed: true,
			Reason: ErrResponseNotShared, Err: errors.New("action replaced before its answer could be read again")}
	}
	return nil
}

// judge is the verdict on sending an existing record rec of a request's
// action at now, under a key window of window: nil (send it, under its
// key: the server answers with its outcome, or performs it once), or why
// not. Outcome-unknown is never sent: ErrKeyWindowExpired past its window,
// else ErrOutcomeUnknown (the server refused its key as reused, or its
// window ended by another clock: the journal does not say which, so the
// refusal does not guess). A record created more than maxClockSkew in the
// clock's future cannot be aged: ErrClockSkew (left as it is, for when the
// clocks agree again). Past its window: ErrKeyWindowExpired (a pending
// one is then outcome-unknown, as its refusal records).
func judge(rec journal.Record, now time.Time, window time.Duration) error {
	switch {
	case rec.State == journal.StateUnknown && windowEnds(rec, now, 0, window):
		return ErrKeyWindowExpired
	case rec.State == journal.StateUnknown:
		return ErrOutcomeUnknown
	case now.Before(rec.CreatedAt.Add(-maxClockSkew)):
		return ErrClockSkew
	case windowEnds(rec, now, 0, window):
		return ErrKeyWindowExpired
	}
	return nil
}

// hand ends flight f, landed, for its n joiners and returns what its
// leader returns: resp or err, the leader's own result. The joiners share
// it (a copy each, of the body read into memory: copyBody), or go again
// (handsOver, and when the leader's own end cut the copy short: the
// answer is theirs all the same, and a resend under the action's key gets
// its replay), or get ErrResponseNotShared: a 101 Switching Protocols
// (its body is the upgraded connection, which only its leader can use),
// or a body that the copy could not take whole. req is the leader's.
func (t *Transport) hand(req *http.Request, f *flight, who *identity, n int, resp *http.Response, err error, pending bool) (*http.Response, error) {
	defer f.release()
	switch {
	case handsOver(leaderEnded(req), who, resp, err, pending):
		// Its joiners carry on the action it reserved, if it did (sent,
		// or still waiting for its lease): they came while it was in the
		// air, and the journal may call it done by now.
		f.again, f.bound = true, f.act.rec.Key != ""
		return resp, err
	case n == 0:
		return resp, err
	case resp == nil:
		f.err = err
		return nil, err
	case resp.StatusCode == http.StatusSwitchingProtocols:
		f.err = f.notShared(who.id, resp, errors.New("a 101 Switching Protocols: its connection is the first caller's"))
		return resp, nil
	}
	cause := f.copyBody(resp, t.cfg.maxShared)
	switch {
	case cause == nil:
	case leaderEnded(req) && f.acting:
		f.again, f.bound = true, true
	default:
		f.err = f.notShared(who.id, resp, cause)
	}
	return resp, nil
}

// handsOver reports whether a flight's leader stopped with its action
// unfinished for a reason its joiners do not share: its caller ended it
// (ended: see leaderEnded), or its deadline cut the retries short; or,
// leading for Resume or carrying a flight's action on, its one action is
// not the journal's any more (boundTo). Its joiners then go again.
func handsOver(ended bool, who *identity, resp *http.Response, err error, pending bool) bool {
	if who.resumed != nil && errors.Is(err, ErrNotResumable) || who.bound != nil && errors.Is(err, ErrResponseNotShared) {
		// Its one action is not the journal's any more (boundTo): its
		// refusal is its own, not its joiners', who may not be bound.
		return true
	}
	if !pending && resp != nil {
		return false
	}
	return ended || errors.Is(err, ErrWaitExceedsDeadline) || errors.Is(GiveUpReason(resp), ErrWaitExceedsDeadline)
}

// leaderEnded reports whether the caller of req, a flight's leader, has
// ended it: its context, or the deprecated Request.Cancel channel, which
// net/http still honours, closed. Either is the caller's alone, not its
// joiners'.
func leaderEnded(req *http.Request) bool {
	if callerEnded(req.Context()) {
		return true
	}
	//lint:ignore SA1019 deprecated, and still honoured by net/http
	cancel := req.Cancel
	select {
	case <-cancel:
		return true
	default: // also when it is nil
		return false
	}
}

// joinVerdict is what a request that joined a flight does once the flight
// has landed.
type joinVerdict uint8

const (
	// takeResult: the flight's action is the request's; it takes its copy
	// of the result.
	takeResult joinVerdict = iota
	// goAgain: it boards again, as a request of its own: the flight was
	// handed over before the action was reserved, or its action is not the
	// request's (another key under the id; an unnamed repeat of an action
	// that was done, past the duplicate window).
	goAgain
	// carryOn: the flight was handed over; the request boards again, bound
	// to the flight's action (identity.bound), which it had joined.
	carryOn
)

// landed decides what a request named by who, which joined flight f at
// arrived, does now that f has landed: it takes f's result, or carries
// f's action on when f was handed over, only if f's action is one its own
// reservation would have taken at arrived (repeatOf), judged by what f's
// reservation found (flight.found), not by what came of it since; else it
// goes again, as a request of its own. hopLive says whether f's action, if
// a done 307/308, had its hop unfinished when the request arrived
// (hopOnArrival): an unnamed request is then a tap of it.
func landed(who *identity, f *flight, arrived time.Time, hopLive bool, duplicateWindow time.Duration) joinVerdict {
	if !f.reserved {
		// Handed over, or refused, before any record was found (the
		// journal failed, Resume held the flight): the request would have
		// been refused too, or carries on by itself.
		if f.again {
			return goAgain
		}
		return takeResult
	}
	found := f.found()
	switch k := who.exact(); {
	case k != "" && k != found.Key:
		return goAgain // another action under the id: its own reservation refuses it
	case k == "" && who.byFingerprint && !who.repeatsOnArrival(found, arrived, duplicateWindow) && !hopLive:
		return goAgain // an unnamed payment made after f's action was done
	case f.again && f.bound:
		return carryOn
	case f.again:
		return goAgain
	}
	return takeResult
}

// holdFlight makes Resume the leader of listed's flight in this Transport,
// waiting for a flight of it in the air to land first.
func (t *Transport) holdFlight(ctx context.Context, listed journal.Record) (*flight, error) {
	for {
		// A flight nobody leads yet (land) is its joiners' to lead: Resume
		// waits for it to land, as for one in the air.
		f, lead, mismatch := t.flights.join(listed.ActionID, listed.Fingerprint, 0, false)
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
		// Either way it lands first; its answer is not Resume's, so its
		// leader makes no copy of it for Resume.
		if !mismatch {
			t.flights.decide(f) // f may have landed since it joined
		}
		if err := waitFor(ctx, t.flights.landing(f)); err != nil {
			return nil, &ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true, Err: err}
		}
	}
}

// unhold ends Resume's hold of flight f, held to resolve listed: whoever
// joined is refused, if the action was confirmed outcome-unknown
// (confirmed); else they go on, one tap, in the flight that goes on from
// it (land, heir).
func (t *Transport) unhold(f *flight, listed journal.Record, confirmed bool) {
	t.flights.land(f)
	if confirmed {
		f.fail(&ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true,
			Reason: ErrOutcomeUnknown})
		return
	}
	f.again = true
	f.release()
}

// stillUnknown reads listed's record again (readListed), and returns nil
// if it is outcome-unknown under listed's key, the only record Resolve may
// be asked about: one gone (someone reconciled it), under another key, or
// done (a request of it in the air got its answer: known, so there is
// nothing to reconcile) is ErrNotResumable.
func (t *Transport) stillUnknown(ctx context.Context, listed journal.Record) error {
	cur, found, err := t.readListed(ctx, listed)
	switch {
	case err != nil:
		return err
	case !found:
		return notResumableError(listed.ActionID, &listed, fmt.Errorf("it was forgotten meanwhile"))
	case cur.Key != listed.Key:
		return notResumableError(listed.ActionID, &listed, nil)
	case cur.State != journal.StateUnknown:
		return &ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: cur.Attempts, Status: cur.Status,
			MaybeProcessed: true, Reason: ErrNotResumable, Err: fmt.Errorf("its record is %s", cur.State)}
	}
	return nil
}

// settled returns nil once listed, outcome-unknown, may be resolved at
// now: the settle time after its key window has passed (no attempt starts
// after the window, and one sent just before may still be processed until
// then); ErrOutcomeUnknown before.
func settled(listed journal.Record, now time.Time, window, settle time.Duration) error {
	if until := listed.CreatedAt.Add(addDuration(window, settle)); now.Before(until) {
		return &ActionError{Action: listed.ActionID, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true,
			Reason: ErrOutcomeUnknown, Err: fmt.Errorf("not to be resolved before %s, the settle time after its key window", until.Format(time.RFC3339))}
	}
	return nil
}
