package idemretry

import (
	"errors"
	"fmt"
	"strings"
)

// Errors returned by the Transport, wrapped; test them with [errors.Is].
// [OutcomeOf] sorts them, and every other result of RoundTrip, into what an
// app does next.
var (
	// ErrKeyWindowExpired: the action's key is older than the key window,
	// so the server may have forgotten it. The request is refused before it
	// is sent. Or the retries stop when the window ends during them, or when
	// the next wait would end after it. The action is outcome-unknown from
	// then on. No request is sent with its key again, and no new key is
	// minted. Reconcile the action ([Transport.Resume] hands it to
	// Resolve), then [journal.Journal.Forget] it.
	ErrKeyWindowExpired = errors.New("idemretry: key window expired")
	// ErrOutcomeUnknown: the action is recorded as outcome-unknown, within
	// its key window. The server refused its key as used for another
	// payload ([ErrKeyReused], when it happened), or its window ended by
	// another clock. Nothing is sent, under its key or a new one. Reconcile
	// it, then [journal.Journal.Forget] it. [Transport.Resume] returns it
	// too for an outcome-unknown action it may not resolve yet (before the
	// settle time after its key window). A request of an action that Resume
	// is resolving is refused with it.
	ErrOutcomeUnknown = errors.New("idemretry: action's outcome is unknown")
	// ErrFingerprintMismatch: an action's id or key was reused for a request
	// with a different method, URL or body (or Resume's Rebuild returned
	// such a request, or one whose method is sent without a key). Nothing
	// of the request was sent; the action's earlier requests may have been
	// (ActionError.MaybeProcessed).
	ErrFingerprintMismatch = errors.New("idemretry: action reused with a different request")
	// ErrFingerprintUncheckable: the action's record holds a keyed
	// fingerprint (a named action's body of 512 bytes or more) that this
	// Transport cannot check. The secret it was made under is gone: the
	// journal's fingerprint.key was deleted or damaged, the record was
	// copied from another journal, or the journal keeps no secret for this
	// Transport. Or AES-GCM is refused (GODEBUG=fips140=only). It comes in
	// an [*ActionError] (MaybeProcessed). Nothing was sent, nor will be
	// until the action's key window ends (then [ErrKeyWindowExpired]).
	ErrFingerprintUncheckable = errors.New("idemretry: keyed fingerprint cannot be checked")
	// ErrInvalidKey: a caller-supplied Idempotency-Key is empty, longer than
	// 255 characters, has characters other than visible ASCII or has a '"' or
	// '\', or the request has more than one such header. Nothing is sent.
	// On a request of a WithAction action it comes in an *ActionError that
	// names the action, with its key, attempts and MaybeProcessed as the
	// journal holds them: an earlier request of it may have been sent. The
	// keys on a request Resume rebuilt are replaced by its listed one,
	// never refused.
	ErrInvalidKey = errors.New("idemretry: invalid idempotency key")
	// ErrBodyTooLarge: a request body without GetBody is larger than the
	// buffering limit (WithMaxBufferedBody), so it could not be resent
	// intact. Nothing was sent. Set Request.GetBody to stream large bodies.
	ErrBodyTooLarge = errors.New("idemretry: request body too large to buffer for retries")
	// ErrClockSkew: the action's key was created in the clock's future: the
	// clock was set back since, or the machines sharing a journal disagree
	// by more than a minute. Its age cannot be known, so nothing was sent;
	// the action is left as it was, for when the clocks agree again.
	ErrClockSkew = errors.New("idemretry: key created in the clock's future")
	// ErrAttemptsExhausted: the retries were used up (WithMaxRetries, or the
	// BackOff said stop). It is the Reason of an *ActionError when the last
	// attempt failed with a transport error, and what GiveUpReason returns
	// when it was answered with a status that is retried (after six 503s,
	// say): RoundTrip then returns that response, with a nil error. The
	// action stays pending with its key.
	ErrAttemptsExhausted = errors.New("idemretry: attempts exhausted")
	// ErrWaitExceedsDeadline: the next wait would end after the context's
	// deadline, so the Transport returned at once instead of sleeping: the
	// Reason of an *ActionError, or, with the last response, what
	// GiveUpReason returns. The action stays pending with its key.
	ErrWaitExceedsDeadline = errors.New("idemretry: next retry would miss the context deadline")
	// ErrInvalidAction: the id given with WithAction is empty, too long for
	// the journal, or uses a reserved prefix. Nothing was sent.
	ErrInvalidAction = errors.New("idemretry: invalid action id")
	// ErrInvalidRequest: the request is nil or has no URL or host.
	ErrInvalidRequest = errors.New("idemretry: invalid request")
	// ErrParked: the retry budget (WithRetryBudget) refused the next retry,
	// as it does when many requests fail at once (an outage). The action is
	// parked, not lost: it stays pending with its key, and a resend of it
	// (the same action id, or the same request) goes out under that key.
	// RoundTrip returns an *ActionError with this reason, the last status
	// and the last cause, never the last response: a parked action must not
	// be mistaken for the server's answer.
	ErrParked = errors.New("idemretry: parked by the retry budget")
	// ErrRetryAfterTooLong: the server asked, with Retry-After, for a wait
	// longer than the cap (WithMaxRetryAfter), so the retries stopped and
	// its response was returned (see GiveUpReason).
	ErrRetryAfterTooLong = errors.New("idemretry: Retry-After beyond the cap")
	// ErrActionRequired: WithRequireAction is set and a keyed request names
	// no action (no Idempotency-Key header, no WithAction id). Nothing was
	// sent.
	ErrActionRequired = errors.New("idemretry: request names no action")
	// ErrResponseNotShared: the request joined an action already in
	// flight, and gets no copy of its response. The response was too large
	// to copy (see [WithMaxSharedResponse]), its body failed to read, or it
	// was a 101 Switching Protocols (its connection is the first caller's).
	// Or the request carried on an action whose first caller gave up, and
	// found the action replaced by a new one (its answer was the replaced
	// one's). The action completed, and the first caller has the response.
	// [ActionError.Status] holds its status. Nothing was sent for the
	// request: resend it to get the server's replay.
	ErrResponseNotShared = errors.New("idemretry: response of a shared flight not copied")
	// ErrNotResumable: [Transport.Resume] found the action it listed no
	// longer as listed when it came to send or resolve it. It did nothing
	// with it. Either an identical unnamed request had started a new action
	// after it finished, or it had been forgotten meanwhile (someone else
	// reconciled it), or a request of another payload under its id was in
	// flight, or, resolving it, Resume found it done. With a journal that
	// is not a [journal.Getter], a forgotten action is recorded again,
	// under its key, as outcome-unknown (never sent), for a later Resolve.
	ErrNotResumable = errors.New("idemretry: listed action no longer pending")
	// ErrInvalidOption: an Option was given a value it cannot use
	// (NewTransport, NewClient), or, at RoundTrip, a RequestOption was, or
	// a BackOff factory returned nil; Resume was given a nil Resumer.
	// Nothing was sent.
	ErrInvalidOption = errors.New("idemretry: invalid option")
	// ErrKeyReused: the server says the action's key was used before with
	// another payload (KeyReuseRejected recognised its answer). No resend with
	// that key can succeed and none is made: the key belongs to a different
	// request, so find out which (another process, a caller-supplied key
	// reused, a server that fingerprints more than the body) before acting.
	// The action is recorded outcome-unknown: a resend of it is refused
	// with ErrOutcomeUnknown.
	ErrKeyReused = errors.New("idemretry: idempotency key reused with another payload")
	// ErrLeaseHeld: another machine sharing the journal is sending the
	// action (it holds the action's lease, see journal.Leaser), and the
	// caller's context ended while this one waited for it. Nothing was sent
	// by this RoundTrip; the other machine may have performed the action.
	// The action stays as it is: resend it, and it keeps its key. From
	// Resume, about an outcome-unknown action: its lease was held, or could
	// not be taken, so Resolve was not asked; a later Resume will.
	ErrLeaseHeld = errors.New("idemretry: action in flight on another machine")
	// ErrLeaseLost: the action's lease passed to another machine while
	// this one was sending it (its renewals failed for longer than the
	// lease lasts), so this one stopped before its next attempt, leaving
	// the action pending with its key.
	ErrLeaseLost = errors.New("idemretry: action taken over by another machine")
)

// ActionError reports an action whose attempts ended without a response to
// return. It names the action, its key and how many attempts were sent, and
// unwraps to both the reason the retries stopped (ErrAttemptsExhausted,
// ErrKeyWindowExpired, ErrWaitExceedsDeadline, ErrFingerprintMismatch, ...)
// and the last cause (a transport error, or the context's error).
type ActionError struct {
	Action string // the action's id
	Key    string // the Idempotency-Key its attempts carried
	// Attempts counts the action's attempts under Key, in all runs
	// recorded: this request's (none, if it was refused before sending,
	// or joined a flight of the action) and the earlier ones. The message
	// tells them apart.
	Attempts int
	// Status is the last response's status, or 0 if none came back.
	Status int
	// MaybeProcessed is false only when no attempt of the action, in this
	// run or an earlier one, can have reached the server (every one failed
	// to connect, or none was made). When true, the server may have
	// performed the action: resend it with the same key (the journal keeps
	// it) or reconcile; never with a new key. For a request without a key
	// that follows a redirect answered to a keyed one (a GET to a 303's
	// receipt), it is true: the keyed request was answered.
	MaybeProcessed bool
	// Reason says why the retries stopped: a sentinel of this package, or
	// nil when the last attempt's own error (Err) ended them — one that is
	// not retried, or the caller's cancellation or deadline.
	Reason error
	Err    error // the last cause, or nil

	// sent is how many of Attempts the request sent, when counted is
	// set: by the attempt loop (run.end), and by RoundTrip for every other
	// ActionError it returns, as nothing was sent for it (see
	// sentNothing). One made elsewhere counts all its Attempts as its
	// request's.
	sent    int
	counted bool
}

// Error names the action and its key (for keyed requests; the key when
// known), the attempts
// (this request's, and the action's earlier ones), the last status, the
// reason and the cause.
func (e *ActionError) Error() string {
	var b strings.Builder
	b.WriteString("idemretry: ")
	switch {
	case e.Action != "" && e.Key != "":
		fmt.Fprintf(&b, "action %q (key %s): ", e.Action, e.Key)
	case e.Action != "":
		fmt.Fprintf(&b, "action %q: ", e.Action) // refused before its key was known
	}
	switch {
	case e.counted && e.sent == 0:
		b.WriteString("nothing sent")
		switch {
		case e.Attempts > 0 && e.Status != 0:
			fmt.Fprintf(&b, " (the action had %s, last status %d)", attempts(e.Attempts), e.Status)
		case e.Attempts > 0:
			fmt.Fprintf(&b, " (the action had %s)", attempts(e.Attempts))
		case e.Status != 0:
			fmt.Fprintf(&b, " (the action was answered %d)", e.Status)
		}
	case e.counted:
		b.WriteString(attempts(e.sent))
		if e.sent < e.Attempts {
			fmt.Fprintf(&b, " (%d with earlier ones)", e.Attempts)
		}
		if e.Status != 0 {
			fmt.Fprintf(&b, ", last status %d", e.Status)
		}
	default:
		b.WriteString(attempts(e.Attempts))
		if e.Status != 0 {
			fmt.Fprintf(&b, ", last status %d", e.Status)
		}
	}
	if e.Reason != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Reason.Error(), "idemretry: "))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Err.Error(), "idemretry: "))
	}
	return b.String()
}

// attempts returns "1 attempt" or "n attempts".
func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// sentNothing returns err, an error of RoundTrip for a request of which
// nothing was sent, with its *ActionError's attempts counted as none of
// the request's, if they are not counted yet: its message then says that
// nothing was sent. The ActionError is copied (a flight's joiners may
// share one).
func sentNothing(err error) error {
	ae, ok := err.(*ActionError)
	if !ok || ae.counted {
		return err
	}
	c := *ae
	c.counted = true
	return &c
}

// Unwrap returns Reason and Err, for errors.Is and errors.As.
func (e *ActionError) Unwrap() []error {
	var out []error
	if e.Reason != nil {
		out = append(out, e.Reason)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// prefixed is an error whose message carries the package prefix once: the
// wrapped error's own "idemretry: " is dropped from the message.
type prefixed struct {
	msg string
	err error
}

// wrapf returns err wrapped with the message "idemretry: <format>: <err>".
func wrapf(err error, format string, args ...any) error {
	return &prefixed{msg: fmt.Sprintf(format, args...), err: err}
}

func (e *prefixed) Error() string {
	return "idemretry: " + e.msg + ": " + strings.TrimPrefix(e.err.Error(), "idemretry: ")
}

func (e *prefixed) Unwrap() error { return e.err }
