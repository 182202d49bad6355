package idemretry

// This file answers the caller's question "what happened to my payment?":
// OutcomeOf sorts whatever RoundTrip (or http.Client.Do over a Transport)
// returned into the few outcomes an app branches on.

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/idemretry/idemretry/journal"
)

// Kind is what an app does next about an action, as OutcomeOf tells it.
// Its values never change between versions (package mobile hands them to
// Kotlin and Swift); new kinds get new values.
type Kind uint8

const (
	// Pending: no final answer is in hand, and the server may have
	// performed the action. An attempt may have reached it and its answer
	// been lost. Or the retries stopped on a status that may heal, or the
	// retry budget parked the action, or it is in flight elsewhere.
	//
	// The action stays pending under its key. Resend it as the same action
	// (the same [WithAction] id, or the same request) to get its answer:
	// now, later, or through [Transport.Resume] at the next start. Never
	// send it as a new action: that may perform it twice. A request of a
	// method sent without a key is no action. A resend of a POST or PATCH
	// sent so ([WithUnkeyedMethods]) may perform it twice.
	//
	// Pending is the zero Kind, so that an Outcome that says nothing reads
	// the safe way.
	Pending Kind = 0
	// Done: the response is the server's final answer (a status the
	// RetryPolicy does not retry: a 201, and a 400 or 422 too), recorded
	// in the journal. Replayed says whether the server replayed it from an
	// earlier attempt, perhaps of an earlier run.
	Done Kind = 1
	// NotSent: no attempt of the action can have reached the server, in
	// this run or an earlier one: every attempt failed to connect, or none
	// was made (the caller's context ended first). The action stays
	// pending under its key: send it again as it is when the network is
	// back, or, to change it, forget it (Journal().Forget) and send the
	// change as a new action.
	NotSent Kind = 2
	// Refused: the Transport did not send the request, for Reason. It
	// would refuse it again as it is until the reason is gone. The reasons
	// are:
	//
	//   - the request is invalid ([ErrInvalidRequest], [ErrActionRequired], ...);
	//   - another payload was sent under its action ([ErrFingerprintMismatch]);
	//   - the action's outcome must be reconciled with the server
	//     ([ErrKeyWindowExpired], [ErrOutcomeUnknown], [ErrKeyReused]);
	//   - the clocks disagree ([ErrClockSkew]);
	//   - the journal failed.
	//
	// When MaybeProcessed is true, an earlier request of the action may
	// have reached the server. Keep the action: resend it once the reason
	// is gone, or ask the server about Key. Never make it a new one.
	Refused Kind = 3
)

var kindNames = [...]string{"pending", "done", "not sent", "refused"}

// String returns "pending", "done", "not sent" or "refused".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// An Outcome is what OutcomeOf makes of one result of RoundTrip.
type Outcome struct {
	Kind Kind
	// Replayed: Done, and the server says it replayed its stored answer
	// (IsReplay): an earlier attempt performed the action.
	Replayed bool
	// Action is the action's id (its WithAction id, or the one the
	// Transport derives from a caller's key or from a fingerprint), and
	// Key its Idempotency-Key, bare; both empty for a request without a
	// key, a refusal before the action was named, or a response that did
	// not come from a Transport.
	Action, Key string
	// Attempts counts the action's attempts, in this run and earlier
	// ones, as recorded (see journal.Record.Attempts); for a response to
	// a request without a key, which is no action, it is 0.
	Attempts int
	// Status is the status of the last answer the server gave, or 0.
	Status int
	// MaybeProcessed is false only when nothing of the action can have
	// reached the server: NotSent, and a Refused request that names no
	// action the Transport can have sent (an invalid one). It is true for
	// every response.
	MaybeProcessed bool
	// Reason says why the Kind is not Done: a sentinel of this package
	// (ErrParked, ErrAttemptsExhausted, ErrKeyWindowExpired, ...), the
	// context's error, a journal's error, or the error itself when no
	// sentinel says more. For Done it is nil, or the error http.Client
	// returned with the response (its CheckRedirect refused to follow it).
	Reason error
}

// OutcomeOf returns the outcome of resp and err, as returned by
// [Transport.RoundTrip] or by [http.Client.Do] over a Transport. err may be
// wrapped: OutcomeOf looks into it with [errors.As]. [Transport.Resume]
// gives each action's outcome in its [ResumeResult].
//
// A response is [Done], or [Pending] when the retries stopped without a
// final answer ([GiveUpReason]). An error is Pending, [NotSent] or
// [Refused]. It carries the action, its key and attempts when the
// Transport knew them. For a response they come through resp.Request, the
// request of the attempt answered, whose context holds them. A copy of a
// response (a flight's joiners get one) keeps them, and so does a response
// whose body http.Client wraps. After a redirect that http.Client followed
// from a keyed request (a 303 to a receipt, say), they are the keyed
// request's, found through resp.Request.Response.
//
// A response that did not come from a Transport is Pending if
// [DefaultRetryPolicy] retries its status: no Transport judged it final.
// Such a response is one the caller, or a RoundTripper above the
// Transport, made. An error OutcomeOf does not know (none of this
// package's, nor a journal's) is Pending with MaybeProcessed: it cannot say
// that nothing was sent. So is an error that joins the errors of several
// actions ([errors.Join]). So is a nil response with a nil error, which
// RoundTrip never returns.
//
// NotSent needs a base that was told of the attempt's writes. A base that
// sends its tries with a context of its own, not the attempt's, cannot say
// that none was written. Its dial errors are Pending too.
func OutcomeOf(resp *http.Response, err error) Outcome {
	var o Outcome
	switch {
	case resp != nil:
		o = responseOutcome(resp)
		if err != nil && o.Reason == nil {
			o.Reason = err // http.Client's CheckRedirect refused to follow resp
		}
	case err != nil:
		o = errorOutcome(err)
	default:
		o = Outcome{MaybeProcessed: true, Reason: errNoResult}
	}
	return o
}

// errNoResult is the Reason of OutcomeOf(nil, nil).
var errNoResult = errors.New("idemretry: neither a response nor an error")

// responseOutcome is OutcomeOf a response: Done, or Pending if the retries
// stopped at it, or if it did not come from a Transport and its status is
// one DefaultRetryPolicy retries.
func responseOutcome(resp *http.Response) Outcome {
	o := Outcome{Kind: Done, Status: resp.StatusCode, MaybeProcessed: true}
	switch reason := GiveUpReason(resp); {
	case reason != nil:
		o.Kind, o.Reason = Pending, reason
	case !fromTransport(resp) && mayHeal(resp):
		// No Transport judged it final (a response the caller, or a
		// RoundTripper above the Transport, made): a 503 is no final
		// answer, whoever built it.
		o.Kind, o.Reason = Pending, errNotFromTransport
	default:
		o.Replayed = IsReplay(resp)
	}
	if a := keyedAttempt(resp); a != nil {
		o.Action, o.Key, o.Attempts = a.act.rec.ActionID, a.act.rec.Key, int(a.act.attempts)
	}
	return o
}

// errNotFromTransport is the Reason of a response that no Transport
// returned, whose status may heal.
var errNotFromTransport = errors.New("idemretry: a response that did not come from a Transport, with a status that is retried")

// fromTransport reports whether resp is an answer a Transport returned:
// its request is one of a Transport's attempts.
func fromTransport(resp *http.Response) bool {
	return resp.Request != nil && attemptOf(resp.Request.Context()) != nil
}

// mayHeal reports whether DefaultRetryPolicy would retry resp, judged by
// its status, its retry hints and whether it is a replay (its body is not
// read).
func mayHeal(resp *http.Response) bool {
	retry, hinted := retryHint(resp.Header)
	if !hinted {
		retry = retryableStatus(resp.StatusCode)
	}
	return retry && !IsReplay(resp)
}

// keyedAttempt returns the attempt of a keyed request that got resp or,
// after redirects http.Client followed, the nearest one before it, or nil.
func keyedAttempt(resp *http.Response) *attemptTrace {
	for r, hops := resp, 0; r != nil && r.Request != nil && hops <= maxRedirectChain; r, hops = r.Request.Response, hops+1 {
		if a := attemptOf(r.Request.Context()); a != nil && a.act != nil {
			return a
		}
	}
	return nil
}

// followsKeyedAnswer reports whether req is a redirect http.Client
// follows from an answer to a keyed request (a GET to a 303's receipt,
// say): the server answered that request, and may have performed it.
func followsKeyedAnswer(req *http.Request) bool {
	return req.Response != nil && keyedAttempt(req.Response) != nil
}

// maxRedirectChain bounds the walk back along the redirects that led to a
// response: http.Client's default policy stops after 10.
const maxRedirectChain = 16

// errorOutcome is OutcomeOf an error.
func errorOutcome(err error) Outcome {
	o := Outcome{MaybeProcessed: true, Reason: err}
	if ae, ok := actionErrorIn(err); ae != nil {
		o.Action, o.Key, o.Attempts, o.Status, o.MaybeProcessed = ae.Action, ae.Key, ae.Attempts, ae.Status, ae.MaybeProcessed
		o.Reason = ae.Reason
		if o.Reason == nil && ae.Err != nil {
			o.Reason = ae.Err
		}
		switch {
		case errors.Is(ae.Reason, ErrLeaseHeld), errors.Is(ae.Reason, ErrLeaseLost), errors.Is(ae.Reason, ErrResponseNotShared):
			// In flight on another machine, or done in a flight whose
			// answer this caller could not have: a resend gets it.
			o.Kind, o.MaybeProcessed = Pending, true
		case refuses(ae.Reason) || errors.Is(ae.Err, ErrFingerprintUncheckable):
			o.Kind = Refused
		case ae.MaybeProcessed:
			o.Kind = Pending
		default:
			o.Kind = NotSent
		}
		return o
	} else if !ok {
		// Errors of several actions, joined by the caller: no one
		// outcome is theirs, and one of them may have been performed.
		return o
	}
	switch {
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidAction),
		errors.Is(err, ErrActionRequired):
		// Refused before any action was named: none of this request's can
		// have been sent by a Transport.
		o.Kind, o.MaybeProcessed = Refused, false
	case errors.Is(err, ErrBodyTooLarge), errors.Is(err, ErrInvalidOption), isJournalError(err):
		// Refused before the journal was asked about the action, or by the
		// journal: an earlier request of the action may have been sent.
		o.Kind = Refused
	}
	return o
}

// actionErrorIn returns the *ActionError in err's tree that OutcomeOf
// reads (ok), or nil if there is none (ok). The tree may hold several of
// one action (a client above the Transport that joins the errors of its
// tries): the first that says MaybeProcessed is read, else the first. If
// it holds errors of more than one action, there is no one to read (ok
// false).
func actionErrorIn(err error) (_ *ActionError, ok bool) {
	all := actionErrors(err, nil)
	if len(all) == 0 {
		return nil, true
	}
	first := all[0]
	for _, ae := range all[1:] {
		if ae.Action != first.Action || ae.Key != first.Key {
			return nil, false
		}
	}
	for _, ae := range all {
		if ae.MaybeProcessed {
			return ae, true
		}
	}
	return first, true
}

// actionErrors appends to out every *ActionError in err's tree, as
// errors.As walks it (an ActionError's own causes are not searched).
func actionErrors(err error, out []*ActionError) []*ActionError {
	for err != nil {
		switch e := err.(type) {
		case *ActionError:
			return append(out, e)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				out = actionErrors(inner, out)
			}
			return out
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		default:
			return out
		}
	}
	return out
}

// refuses reports whether reason is one that refuses the action as it is,
// now and at every resend until something else changes.
func refuses(reason error) bool {
	for _, r := range [...]error{ErrInvalidKey, ErrKeyWindowExpired, ErrOutcomeUnknown, ErrKeyReused, ErrFingerprintMismatch,
		ErrFingerprintUncheckable, ErrClockSkew, ErrNotResumable} {
		if errors.Is(reason, r) {
			return true
		}
	}
	return false
}

// isJournalError reports whether err is one of the errors journals return.
func isJournalError(err error) bool {
	for _, s := range [...]error{journal.ErrClosed, journal.ErrUnavailable, journal.ErrInvalidRecord, journal.ErrIncompatible, journal.ErrNotFound} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func clampInt32(n int) int32 {
	switch {
	case n > 1<<31-1:
		return 1<<31 - 1
	case n < 0:
		return 0
	}
	return int32(n)
}
