package idemretry

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
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
	// (The flags and attempts sit together, to keep a flight, which
	// holds an action, small.)
	fresh bool
	// byFingerprint: the action is named by its request's fingerprint.
	byFingerprint bool
	// syncDone: the action's done must be durable before RoundTrip
	// returns (see run.end): it is named by its fingerprint, or it is the
	// 307/308 hop of one (see actionID), whose done, lost, would leave
	// the hop pending, and a deliberate repeat of the payment taken for a
	// tap of it (hopUnfinished), answered with its replay.
	syncDone bool
	// attempts is the action's attempts, in all runs recorded, when its
	// RoundTrip returned a response: what OutcomeOf reads (see run.end).
	attempts  int32
	createdAt time.Time
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
	id string
	fp journal.Fingerprint
	// callerKey is the key found on the request, bare, or "": the key
	// that names the action when no WithAction id does; under one, the
	// key the action adopts if it is new (its first key, kept for good:
	// the journaled key goes on every later request of it, whatever key
	// the request carries).
	callerKey string
	// callerForm is the form the request wrote callerKey in (bare or
	// quoted), which a new record of the action takes with the key: a
	// caller's key goes out as written. A 307/308 hop carrying its
	// parent's key takes the form its parent sent it in (see identify).
	callerForm journal.KeyForm
	// byFingerprint: the action is named by its request's fingerprint (no
	// caller key, no WithAction).
	byFingerprint bool
	// syncDone: see action.
	syncDone bool
	// resumed marks a request Transport.Resume rebuilt, with the record
	// it listed, or is nil: its action is resumed under its key, or not at
	// all (see reserve).
	resumed *resumeMark
	// bound is the action a request that joined a flight carries on when
	// the flight's leader handed it over (see landed): that action, under
	// its key, whatever the journal says of it since, or nil.
	bound *journal.Record
	// flight is the flight the request leads, which its first reservation
	// tells what it found (see landed), or nil.
	flight *flight
	// asker is askerOf the request's header: it takes a flight's result
	// only if the flight's leader asked as the same principal.
	asker uint32
	// arrived is when an unnamed request arrived (earlierNow, as fly
	// began): the duplicate window is judged at that time, the tap's, not
	// at its reservation's, which a slow journal, a retry of the journal
	// call or a clock set forward meanwhile would put later (repeatOf,
	// landed). Zero for a named request. arrivedKept is the journal's
	// time then (journal.Timekeeper), or zero (repeatsOnArrival).
	arrived, arrivedKept time.Time
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
	who, err := t.identifyAction(req, b)
	who.asker = askerOf(req.Header, t.cfg.header)
	return who, err
}

// identifyAction is identify but for the request's asker.
func (t *Transport) identifyAction(req *http.Request, b *body) (identity, error) {
	if m, ok := req.Context().Value(resumeKey{}).(*resumeMark); ok {
		// Resume's action goes out under its listed key, whatever keys
		// the rebuilt request carries.
		return resumedIdentity(req, b, m, &t.fpKey)
	}
	named, explicit := actionOf(req.Context())
	callerKey, callerForm, err := t.requestKey(req)
	if err != nil {
		if explicit && checkActionID(named) == nil {
			return identity{}, t.invalidKeyOf(req.Context(), named, err)
		}
		return identity{}, err
	}
	// http.Client copies to a 307/308 hop the key of the caller's request
	// as the caller wrote it; the parent sent it in its action's form,
	// which may be the other one (an earlier request of the action wrote
	// it so): the hop sends it as the parent did.
	if k, f, ok := t.parentKey(req); ok && callerKey != "" && k == callerKey {
		callerForm = f
	}
	// A named action's first hop may have a keyed fingerprint: its id
	// does not depend on it.
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
	return identity{id: id, fp: fp, callerKey: callerKey, callerForm: callerForm, byFingerprint: byFP, syncDone: byFP || hop}, nil
}

// requestKey returns the key req carries, bare, and the form it was
// written in, or "" if none; ErrInvalidKey if it carries more than one, or
// one that is not a key.
func (t *Transport) requestKey(req *http.Request) (string, journal.KeyForm, error) {
	switch vs := headerValues(req.Header, t.cfg.header); len(vs) {
	case 0:
		return "", 0, nil
	case 1:
		return parseKeyForm(vs[0])
	default:
		return "", 0, fmt.Errorf("%w: %d %s headers", ErrInvalidKey, len(vs), t.cfg.header)
	}
}

// invalidKeyOf refuses a request of action id (a WithAction id) whose key
// is invalid (cause): nothing is sent, and the refusal is the action's,
// with its key and attempts and MaybeProcessed as the journal has them.
// An earlier request of the action may have reached the server: only a
// journal that says it holds no record of id (a journal.Getter), with no
// request of it in flight here, makes MaybeProcessed false.
func (t *Transport) invalidKeyOf(ctx context.Context, id string, cause error) error {
	ae := &ActionError{Action: id, MaybeProcessed: true, Reason: cause, counted: true}
	g, ok := t.journal.(journal.Getter)
	if !ok || t.flights.find(id) != nil {
		return ae
	}
	jctx, cancel := t.journalContext(ctx)
	defer cancel()
	rec, found, err := g.Get(jctx, id)
	switch {
	case err != nil:
	case found:
		ae.Key, ae.Attempts, ae.Status = rec.Key, rec.Attempts, rec.Status
	default:
		ae.MaybeProcessed = false
	}
	return ae
}

// resumedIdentity names a request Resume rebuilt for the record m lists:
// exactly that action, which the rebuilt request must match (its
// fingerprint, in the record's form), never a new one. An action listed by
// its digest is recognised as named by its fingerprint when the digest is
// that of the rebuilt request's fingerprint id, so that it is reserved and
// synced as one.
func resumedIdentity(req *http.Request, b *body, m *resumeMark, key *fpKey) (identity, error) {
	rec := m.rec
	if err := journal.CheckStored(rec); err != nil {
		return identity{}, wrapf(err, "resume") // listed damaged: nothing of it is sent
	}
	fp, same, err := matchFingerprint(req, b, rec.Fingerprint, key)
	if errors.Is(err, ErrFingerprintUncheckable) {
		// Never sent; reserve refuses it, or finds its key window ended
		// (then it is outcome-unknown, for Resolve). A keyed fingerprint
		// is a named action's: never one named by its fingerprint.
		who := identity{id: rec.ActionID, fp: rec.Fingerprint, resumed: m, uncheckable: true}
		if strings.HasPrefix(rec.ActionID, keyActionPrefix) {
			who.callerKey, who.callerForm = rec.Key, rec.KeyForm
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
		who.callerKey, who.callerForm = rec.Key, rec.KeyForm
		// Perhaps the hop of an action named by its fingerprint: the id
		// does not tell, and a sync too many costs only time.
		who.syncDone = strings.Contains(rec.ActionID, redirectActionInfix)
	}
	who.syncDone = who.syncDone || who.byFingerprint
	return who, nil
}

// mintWant returns the record to reserve for who: a new key (the one found
// on the request, adopted in the form the request wrote it, or a UUIDv4
// minted now, in WithQuotedKey's form) created now, pending; or, for a
// request bound to one action (see identity.exact), that action's key, in
// its form, and creation time. The record's form is the key's for good:
// every attempt sends the key in its record's form (Transport.quotedForm).
// Resume's is created outcome-unknown: its record is created only if it
// was forgotten since it was listed, and then never sent and handed to
// Resolve (see boundTo). Created pending, it would be sent (a payment the
// app had cancelled), also by another process that shares the journal;
// forgotten again at once, a crash or another process could come in
// between.
//
// A new record counts the first attempt already: it is durable before that
// attempt leaves, and a process killed during it must not leave a record
// that says nothing was sent (see journal.Record.Attempts).
func (t *Transport) mintWant(who *identity) (journal.Record, error) {
	want := journal.Record{ActionID: who.id, Key: who.callerKey, KeyForm: who.callerForm, Fingerprint: who.fp,
		CreatedAt: t.cfg.clock.Now(), State: journal.StatePending, Attempts: 1}
	switch {
	case who.resumed != nil:
		l := &who.resumed.rec
		want.Key, want.KeyForm, want.CreatedAt, want.Attempts, want.Status = l.Key, l.KeyForm, l.CreatedAt, l.Attempts, l.Status
		want.State = journal.StateUnknown
	case who.bound != nil:
		want.Key, want.KeyForm, want.CreatedAt = who.bound.Key, who.bound.KeyForm, who.bound.CreatedAt
	case want.Key == "":
		key, err := t.cfg.newKey()
		if err != nil {
			return journal.Record{}, fmt.Errorf("idemretry: new key: %w", err)
		}
		want.Key, want.KeyForm = key, journal.KeyFormBare
		if t.cfg.quoted {
			want.KeyForm = journal.KeyFormQuoted
		}
	}
	return want, nil
}

// keyReplaced logs, at Debug, that a request of who's action goes out
// under rec's key, the action's, rather than the key it carries (an
// SDK's, minted per call, on a named action's later request), or in rec's
// form rather than the one the request wrote it in.
func (t *Transport) keyReplaced(ctx context.Context, who *identity, rec journal.Record) {
	if who.callerKey == "" || t.cfg.logger == nil {
		return
	}
	quoted, asWritten := t.quotedForm(rec.KeyForm), t.quotedForm(who.callerForm)
	if who.callerKey == rec.Key && quoted == asWritten {
		return
	}
	attrs := []slog.Attr{slog.String("action", who.id), slog.String("key", rec.Key), slog.String("request_key", who.callerKey)}
	if quoted != asWritten {
		attrs = append(attrs, slog.Bool("quoted", quoted), slog.Bool("request_quoted", asWritten))
	}
	t.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "idemretry: the request's key replaced by its action's", attrs...)
}

// quotedForm reports whether a key whose record says form goes out quoted:
// in its recorded form, or, unrecorded (a record of a release before forms
// were recorded, or of a journal that keeps none), in WithQuotedKey's, as
// such a release sent every key.
func (t *Transport) quotedForm(form journal.KeyForm) bool {
	return form == journal.KeyFormQuoted || form == journal.KeyFormUnrecorded && t.cfg.quoted
}

// stillListed returns ErrNotResumable if listed, the record Resume listed
// for action id, has been forgotten since (someone reconciled it), when
// the journal can tell without creating it (a journal.Getter): it is not
// Resume's to bring back.
func (t *Transport) stillListed(ctx, jctx context.Context, id string, listed *journal.Record) error {
	g, ok := t.journal.(journal.Getter)
	if !ok {
		return nil
	}
	if _, found, err := g.Get(jctx, id); err != nil {
		return wrapf(journalError(ctx, err), "read action %q", id)
	} else if !found {
		return notResumableError(id, listed, errors.New("it was forgotten meanwhile"))
	}
	return nil
}

// reserveRecord is the one call of journal.Journal.Reserve on the request
// path, counted in Stats: the place to check what it returns.
func (t *Transport) reserveRecord(jctx context.Context, want journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	start := time.Now()
	rec, created, err := t.journal.Reserve(jctx, want, mode)
	t.counters.reserves.Add(1)
	t.counters.reserveNanos.Add(int64(time.Since(start)))
	return rec, created, checkReserved(rec, err) // keyjournal.go: never a record unchecked
}

// checkPayload returns nil if the request p, who names, is the payload of
// its action's record rec; else why it cannot be sent under rec's key:
// ErrFingerprintMismatch, or the body's error or ErrFingerprintUncheckable
// (the action exists, and an earlier run may have sent it). An
// uncheckable payload is not refused as such once rec's key window has
// ended at now: whatever its payload, nothing of it may be sent then, and
// it goes the way of any action past its window (judge).
func (t *Transport) checkPayload(p payload, who *identity, rec journal.Record, now time.Time, window time.Duration) error {
	var same bool
	err := ErrFingerprintUncheckable
	if !who.uncheckable {
		_, same, err = t.samePayload(p, who, rec.Fingerprint)
	}
	switch {
	case errors.Is(err, ErrFingerprintUncheckable) && windowEnds(rec, now, 0, window):
		return nil
	case err != nil:
		return &ActionError{Action: who.id, Key: rec.Key, Attempts: rec.Attempts, Status: rec.Status, MaybeProcessed: true, Err: err}
	case !same:
		return refusal(who.id, rec, ErrFingerprintMismatch)
	}
	return nil
}

// expire records rec, the pending record of who's action whose key window
// has ended, outcome-unknown (pending -> unknown), and says so.
func (t *Transport) expire(ctx context.Context, who *identity, rec journal.Record) {
	rec.State = journal.StateUnknown
	if who.resumed != nil {
		who.resumed.unknown.Store(true)
	}
	t.record(ctx, rec, false)
	t.logUnknown(ctx, rec, ErrKeyWindowExpired)
	t.emit(ctx, Event{Kind: EventUnknown, Action: who.id, Key: rec.Key, Attempt: rec.Attempts, Reason: ErrKeyWindowExpired})
}

// refusal is the error of a request of action id refused for reason
// before sending, its record rec existing: an earlier run may have sent it.
func refusal(id string, rec journal.Record, reason error) error {
	return &ActionError{Action: id, Key: rec.Key, Attempts: rec.Attempts, Status: rec.Status, MaybeProcessed: true, Reason: reason}
}

// actionID names req's action: the id given with WithAction (id, when
// explicit: actionOf of req's context), the app's durable name for it,
// which outlives any key an SDK puts on one call (the key found on the
// request is then only the key the action adopts if it is new: mintWant);
// else a key the caller set (the server knows the action by its key, so
// one key must mean one payload); else the request's fingerprint. A hop of
// http.Client's 307/308 redirect is a sub-action of its parent, with its own
// record: the first server did not perform the action, the next one might.
// It adopts the key http.Client copied to it from the caller's request, if
// any (a key the caller or an SDK set), else gets one of its own. An
// unnamed parent's hop is named by the parent's key, not by its own
// fingerprint: a caller that joined the parent's flight follows the same
// redirect, and must find the hop the leader made, done or not.
func (t *Transport) actionID(req *http.Request, callerKey, id string, explicit bool, fp journal.Fingerprint) (string, error) {
	switch {
	case explicit:
		if err := checkActionID(id); err != nil {
			return "", err
		}
	case callerKey != "":
		id = keyActionPrefix + callerKey
	default:
		parent, _, ok := t.parentKey(req)
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

// parentKey returns the key that the request redirected to req carried,
// and the form it went out in.
func (t *Transport) parentKey(req *http.Request) (string, journal.KeyForm, bool) {
	if req.Response == nil || req.Response.Request == nil {
		return "", 0, false
	}
	vs := headerValues(req.Response.Request.Header, t.cfg.header)
	if len(vs) != 1 {
		return "", 0, false
	}
	k, f, err := parseKeyForm(vs[0])
	return k, f, err == nil
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
