package idemretry

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// action is a reserved action during one RoundTrip.
type action struct {
	rec journal.Record // as the journal holds it
	// fresh: this RoundTrip minted the key, at createdAt (the clock's
	// reading, with its monotonic part on the system clock). Otherwise an
	// earlier RoundTrip, perhaps in a process that died, may have sent it.
	fresh     bool
	createdAt time.Time
	// byFingerprint: the action is named by its request's fingerprint.
	byFingerprint bool
	// syncDone: the action's done must be durable before RoundTrip
	// returns (see run.end): it is named by its fingerprint, or it is the
	// 307/308 hop of one (see actionID), whose done, lost, would leave
	// the hop pending, and a deliberate repeat of the payment taken for a
	// tap of it (hopUnfinished), answered with its replay.
	syncDone bool
	// window is the action's key window for this RoundTrip.
	window time.Duration
	// resumed marks an action Transport.Resume sends, or is nil.
	resumed *resumeMark
}

// identity is what names a keyed request's action, found before anything
// is reserved or sent.
type identity struct {
	// id also names the action's flight: ids with the same digest form
	// share one (see flights), so that a request and a Resume of an action
	// a hashing journal listed by its digest share one flight.
	id        string
	fp        journal.Fingerprint
	callerKey string // the key the caller set, bare, or ""
	// byFingerprint: the action is named by its request's fingerprint (no
	// caller key, no WithAction).
	byFingerprint bool
	// syncDone: see action.
	syncDone bool
	// resumed marks a request Transport.Resume rebuilt, with the record
	// it listed, or is nil: its action is resumed under its key, or not at
	// all (see reserve).
	resumed *resumeMark
	// uncheckable: a resumed action whose record's keyed fingerprint
	// cannot be checked here (resumedIdentity): never sent, and refused
	// as uncheckable until its key window ends, then recorded
	// outcome-unknown as any pending action past its window (reserve).
	uncheckable bool
}

// payload is a keyed request's method, URL and body, for checking it
// against a fingerprint of another form or salt (samePayload). It is
// passed apart from identity, which leaks: the body stays on RoundTrip's
// stack.
type payload struct {
	req  *http.Request
	body *body
}

// samePayload reports whether p, the request who names, is the payload fp
// was made from, fp being its action's fingerprint as the journal or the
// flight's leader holds it: equal to who.fp, or, when either is keyed
// (each new record draws its own salt), equal when p's is computed in fp's
// form. It returns p's fingerprint in that form. Its errors are the
// body's, and ErrFingerprintUncheckable.
func (t *Transport) samePayload(p payload, who *identity, fp journal.Fingerprint) (journal.Fingerprint, bool, error) {
	if fp == who.fp {
		return fp, true, nil
	}
	if !isKeyed(fp) && !isKeyed(who.fp) {
		return who.fp, false, nil // plain both: computed alike
	}
	mine, same, err := matchFingerprint(p.req, p.body, fp, &t.fpKey)
	if err != nil {
		return who.fp, false, err
	}
	return mine, same, nil
}

// identify names req's action.
func (t *Transport) identify(req *http.Request, b *body) (identity, error) {
	var callerKey string
	if vs := headerValues(req.Header, t.cfg.header); len(vs) > 1 {
		return identity{}, fmt.Errorf("%w: %d %s headers", ErrInvalidKey, len(vs), t.cfg.header)
	} else if len(vs) == 1 {
		var err error
		if callerKey, err = parseKey(vs[0]); err != nil {
			return identity{}, err
		}
	}
	if m, ok := req.Context().Value(resumeKey{}).(*resumeMark); ok {
		return resumedIdentity(req, b, m, &t.fpKey)
	}
	// A named action's first hop may have a keyed fingerprint: its id
	// does not depend on it.
	named, explicit := actionOf(req.Context())
	fp, err := newFingerprint(req, b, (callerKey != "" || explicit) && req.Response == nil, &t.fpKey)
	if err != nil {
		return identity{}, err
	}
	id, err := t.actionID(req, callerKey, named, explicit, fp)
	if err != nil {
		return identity{}, err
	}
	byFP := strings.HasPrefix(id, fingerprintActionPrefix)
	if byFP && t.cfg.requireAction {
		return identity{}, fmt.Errorf("%w: %s %s has neither an %s header nor a WithAction id",
			ErrActionRequired, req.Method, req.URL.Redacted(), t.cfg.header)
	}
	// A hop named by its parent's key (neither a caller key nor an action
	// id to carry to it) is the hop of an action named by its fingerprint.
	hop := callerKey == "" && !explicit && req.Response != nil && strings.HasPrefix(id, keyActionPrefix)
	return identity{id: id, fp: fp, callerKey: callerKey, byFingerprint: byFP, syncDone: byFP || hop}, nil
}

// resumedIdentity names a request Resume rebuilt for the record m lists:
// exactly that action, which the rebuilt request must match (its
// fingerprint, in the record's form), never a new one. An action listed by
// its digest is recognised as named by its fingerprint when the digest is
// that of the rebuilt request's fingerprint id, so that it is reserved and
// synced as one.
func resumedIdentity(req *http.Request, b *body, m *resumeMark, key *fpKey) (identity, error) {
	rec := m.rec
	fp, same, err := matchFingerprint(req, b, rec.Fingerprint, key)
	if errors.Is(err, ErrFingerprintUncheckable) {
		// Never sent; reserve refuses it, or finds its key window ended
		// (then it is outcome-unknown, for Resolve). A keyed fingerprint
		// is a named action's: never one named by its fingerprint.
		who := identity{id: rec.ActionID, fp: rec.Fingerprint, resumed: m, uncheckable: true}
		if strings.HasPrefix(rec.ActionID, keyActionPrefix) {
			who.callerKey = rec.Key
		}
		return who, nil
	}
	if err != nil { // the rebuilt body
		return identity{}, &ActionError{Action: rec.ActionID, Key: rec.Key, Attempts: rec.Attempts, MaybeProcessed: true, Err: err}
	}
	if !same {
		return identity{}, &ActionError{Action: rec.ActionID, Key: rec.Key, Attempts: rec.Attempts, MaybeProcessed: true,
			Reason: ErrFingerprintMismatch}
	}
	who := identity{id: rec.ActionID, fp: fp, resumed: m}
	if fpID := fingerprintActionID(fp); rec.ActionID == fpID || rec.ActionID == journal.Digest(fpID) {
		who.id, who.byFingerprint = fpID, true
	} else if strings.HasPrefix(rec.ActionID, keyActionPrefix) {
		who.callerKey = rec.Key
		// Perhaps the hop of an action named by its fingerprint: the id
		// does not tell, and a sync too many costs only time.
		who.syncDone = strings.Contains(rec.ActionID, redirectActionInfix)
	}
	who.syncDone = who.syncDone || who.byFingerprint
	return who, nil
}

// reserve reserves the key of the action named by who, durably, and
// returns dst set to it. It sends nothing. Only the leader of the action's
// flight calls it, so calls for one action never overlap within a
// Transport.
func (t *Transport) reserve(ctx context.Context, who identity, p payload, window time.Duration, dst *action) (*action, error) {
	id := who.id
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	if err := t.landOutcome(ctx, jctx, id); err != nil {
		return nil, err
	}
	key := who.callerKey
	if key == "" {
		var err error
		if key, err = t.cfg.newKey(); err != nil {
			return nil, fmt.Errorf("idemretry: new key: %w", err)
		}
	}
	createdAt := t.cfg.clock.Now()
	want := journal.Record{ActionID: id, Key: key, Fingerprint: who.fp, CreatedAt: createdAt, State: journal.StatePending}
	mode := journal.ReuseAny
	if who.resumed != nil {
		// Exactly the listed action: never a new key. Its record is
		// created only if it was forgotten since it was listed, and then
		// as it was listed, but outcome-unknown: never sent, and handed to
		// Resolve (see below). Created pending, it would be sent (a
		// payment the app had cancelled), also by another process that
		// shares the journal; forgotten again at once, a crash or another
		// process could come in between.
		l := &who.resumed.rec
		want.Key, want.CreatedAt, want.Attempts, want.Status = l.Key, l.CreatedAt, l.Attempts, l.Status
		want.State = journal.StateUnknown
	}
	if who.resumed != nil {
		if g, ok := t.journal.(journal.Getter); ok {
			// A listed action forgotten since (someone reconciled it) is
			// not created again: it is not Resume's to bring back.
			if _, found, err := g.Get(jctx, id); err != nil {
				return nil, wrapf(journalError(ctx, err), "read action %q", id)
			} else if !found {
				return nil, notResumableError(id, &who.resumed.rec, errors.New("it was forgotten meanwhile"))
			}
		}
	}
	start := createdAt // a reading of the system clock, with its monotonic part
	if _, system := t.cfg.clock.(systemClock); !system {
		start = time.Now()
	}
	rec, created, err := t.journal.Reserve(jctx, want, mode)
	t.counters.reserves.Add(1)
	t.counters.reserveNanos.Add(int64(time.Since(start)))
	if err == nil && !created && who.resumed == nil && who.byFingerprint && mode == journal.ReuseAny && rec.State == journal.StateDone &&
		(t.cfg.duplicateWindow <= 0 || !t.earlierNow().Before(rec.CreatedAt.Add(t.cfg.duplicateWindow))) {
		// A repeat after the duplicate window (none by default): a new
		// action, unless the done answer was a 307/308 whose hop is still
		// unfinished, in flight here or pending in the journal: the
		// action is then not finished, and the repeat is a tap of it,
		// which goes out under its key and joins its hop.
		var unfinished bool
		if unfinished, err = t.hopUnfinished(jctx, rec); err == nil && !unfinished {
			rec, created, err = t.journal.Reserve(jctx, want, journal.ReusePending)
		}
	}
	err = checkReserved(rec, err) // keyjournal.go: never a record unchecked
	if err != nil {
		return nil, wrapf(journalError(ctx, err), "reserve key for action %q", id)
	}
	if who.syncDone && !who.byFingerprint && who.resumed == nil {
		t.hops.add(id) // a live 307/308 hop of an unnamed payment
	}
	fail := func(reason error) (*action, error) {
		return nil, &ActionError{Action: id, Key: rec.Key, Attempts: rec.Attempts, Status: rec.Status,
			MaybeProcessed: true, Reason: reason} // the record existed: an earlier run may have sent it
	}
	if who.resumed != nil && (created || rec.Key != who.resumed.rec.Key) {
		if created {
			who.resumed.unknown.Store(true)
			t.logUnknown(ctx, rec, ErrNotResumable)
			t.emit(ctx, Event{Kind: EventUnknown, Action: id, Key: rec.Key, Attempt: rec.Attempts, Reason: ErrNotResumable})
		}
		return nil, notResumableError(id, &who.resumed.rec, nil)
	}
	if created {
		// A key minted just now: its age is measured from createdAt (on the
		// system clock, monotonically), never inferred, so no clock
		// disagreement can refuse it.
		*dst = action{rec: rec, fresh: true, createdAt: createdAt, byFingerprint: who.byFingerprint, syncDone: who.syncDone, window: window, resumed: who.resumed}
		return dst, nil
	}
	now := t.now()
	var same bool
	err = ErrFingerprintUncheckable
	if !who.uncheckable {
		_, same, err = t.samePayload(p, &who, rec.Fingerprint)
	}
	switch {
	case errors.Is(err, ErrFingerprintUncheckable) && windowEnds(rec, now, 0, window):
		// Whatever its payload, nothing of it may be sent now: it goes
		// the way of any action past its key window (below), not refused
		// as uncheckable for ever.
	case err != nil:
		// The body read again, or a keyed fingerprint that cannot be
		// checked: the action exists, and an earlier run may have sent it.
		return nil, &ActionError{Action: id, Key: rec.Key, Attempts: rec.Attempts, Status: rec.Status, MaybeProcessed: true, Err: err}
	case !same:
		return fail(ErrFingerprintMismatch)
	}
	switch {
	case rec.State == journal.StateUnknown && windowEnds(rec, now, 0, window):
		return fail(ErrKeyWindowExpired)
	case rec.State == journal.StateUnknown:
		// Recorded unknown for another reason (the server refused the key
		// as reused), or by a clock that disagrees: the journal does not
		// say which, so the refusal does not guess.
		return fail(ErrOutcomeUnknown)
	case now.Before(rec.CreatedAt.Add(-maxClockSkew)):
		// Created in the clock's future: its age cannot be known now.
		// Refuse, and leave it as it is for when the clocks agree again.
		return fail(ErrClockSkew)
	case windowEnds(rec, now, 0, window):
		if rec.State == journal.StatePending {
			rec.State = journal.StateUnknown
			if who.resumed != nil {
				who.resumed.unknown.Store(true)
			}
			t.record(ctx, rec, false)
			t.logUnknown(ctx, rec, ErrKeyWindowExpired)
			t.emit(ctx, Event{Kind: EventUnknown, Action: id, Key: rec.Key, Attempt: rec.Attempts, Reason: ErrKeyWindowExpired})
		}
		return fail(ErrKeyWindowExpired)
	}
	*dst = action{rec: rec, byFingerprint: who.byFingerprint, syncDone: who.syncDone, window: window, resumed: who.resumed}
	return dst, nil
}

// actionID names req's action: a key the caller set names it (the server
// knows the action by its key, so one key must mean one payload); else the
// id given with WithAction (id, when explicit: actionOf of req's context);
// else the request's fingerprint. A hop of
// http.Client's 307/308 redirect is a sub-action of its parent, with its own
// key: the first server did not perform the action, the next one might. An
// unnamed parent's hop is named by the parent's key, not by its own
// fingerprint: a caller that joined the parent's flight follows the same
// redirect, and must find the hop the leader made, done or not.
func (t *Transport) actionID(req *http.Request, callerKey, id string, explicit bool, fp journal.Fingerprint) (string, error) {
	switch {
	case callerKey != "":
		id = keyActionPrefix + callerKey
	case explicit:
		if err := checkActionID(id); err != nil {
			return "", err
		}
	default:
		parent, ok := t.parentKey(req)
		if !ok {
			return fingerprintActionID(fp), nil
		}
		id = keyActionPrefix + parent
	}
	if req.Response != nil {
		id += redirectActionInfix + hex.EncodeToString(fp[:8])
	}
	return id, nil
}

// parentKey returns the key that the request redirected to req carried.
func (t *Transport) parentKey(req *http.Request) (string, bool) {
	if req.Response == nil || req.Response.Request == nil {
		return "", false
	}
	vs := headerValues(req.Response.Request.Header, t.cfg.header)
	if len(vs) != 1 {
		return "", false
	}
	k, err := parseKey(vs[0])
	return k, err == nil
}

// notResumableError refuses to send a request Resume rebuilt for listed,
// whose action the journal no longer holds pending under listed's key:
// replaced by a new action (a repeat of an unnamed payment, after the
// listed one finished), whose flight sending it would join, or forgotten
// (and recorded again, outcome-unknown, by reserve).
func notResumableError(id string, listed *journal.Record, cause error) error {
	return &ActionError{Action: id, Key: listed.Key, Attempts: listed.Attempts, MaybeProcessed: true,
		Reason: ErrNotResumable, Err: cause}
}
