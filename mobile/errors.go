package idemretry

import (
	"context"
	"errors"
	"net/url"
	"strings"

	root "github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Outcomes: what the app does next about an action, as ErrorOutcome and
// Failure.Outcome say. They are the Go package's (idemretry.OutcomeOf's
// Kinds), with the same values, which never change; each error kind below
// is one of them, and says which:
//
//	OutcomeDone     KindNone
//	OutcomeNotSent  KindNetwork
//	OutcomePending  KindMaybeProcessed, KindGaveUp, KindParked, KindOther
//	OutcomeRefused  KindInvalidRequest, KindWindowExpired, KindFingerprintMismatch,
//	                KindClockSkew, KindJournal, KindClosed, KindOutcomeUnknown
const (
	// OutcomePending: no final answer came, and the server may have
	// performed the action: send it again with the same ActionID (now,
	// later, or through Resume on the next start) to get its answer;
	// never as a new action.
	OutcomePending = int32(root.Pending)
	// OutcomeDone: the server's final answer is in hand (no error).
	OutcomeDone = int32(root.Done)
	// OutcomeNotSent: nothing of the action can have reached the server.
	// Send it again with the same ActionID, or Forget it and send a
	// changed payment as a new action.
	OutcomeNotSent = int32(root.NotSent)
	// OutcomeRefused: nothing was sent, and sending it again as it is
	// would be refused again: the kind says why and what to do. When
	// MaybeProcessed is true an earlier send of the action may have
	// reached the server: keep the action (resend it once the cause is
	// gone, or ask the server about Key), never make it a new one.
	OutcomeRefused = int32(root.Refused)
)

// Error kinds: what ErrorKind returns and Failure.Kind holds. They are
// finer than the outcomes: each says which outcome it is. Their values
// never change between versions; new kinds get new values.
const (
	// KindNone: no error (ErrorKind of null). OutcomeDone.
	KindNone int32 = 0
	// KindOther: an error this package does not classify, such as one
	// returned by the app's own Rebuilder. Read its message.
	// OutcomePending: it cannot say that nothing was sent.
	KindOther int32 = 1
	// KindInvalidRequest: the request (or an argument) was refused before
	// anything was sent or journaled: no method, a URL that is not
	// absolute http or https, a header that cannot be sent (a name that
	// is not an HTTP token, a value with a control character other than
	// HTAB: CR, LF, NUL, ESC, DEL...), a negative timeout, a POST or
	// PATCH without an ActionID (or an Idempotency-Key header), a request
	// with both, an ActionID that is too long or starts with "key:" or
	// "fp:", a request Resume's Rebuilder built for another action.
	// Fix the request; this send did nothing on the server.
	// OutcomeRefused.
	KindInvalidRequest int32 = 2
	// KindNetwork: the attempts ended (on the timeout, or after every
	// retry) and none of them can have reached the server: every one
	// failed before a byte was written (no network, connection refused,
	// a name that does not resolve), or none was made. The action is
	// still pending with its key: send it again, with the same ActionID,
	// when the network is back; or, to change the payment, Forget it and
	// send the change as a new action. OutcomeNotSent.
	KindNetwork int32 = 3
	// KindMaybeProcessed: the attempts ended without an answer after at
	// least one reached the server (the connection broke or the timeout
	// came while waiting for the answer), or the answer came and its body
	// was lost, or the server answered with a redirect (a 303 to a receipt
	// after the charge, say) and following it failed (Status holds the
	// redirect's status). The server may have performed the action: send it again
	// with the same ActionID (or let Resume do it on the next start) to get
	// its answer; never make it a new action. MaybeProcessed is true.
	// OutcomePending.
	KindMaybeProcessed int32 = 4
	// KindGaveUp: the server answered every attempt with a status that may
	// heal (5xx except 501 and 505, 429, 409) until the retries stopped,
	// or asked to be called back later than the retries may wait
	// (Retry-After). Status holds its last status. The action is pending
	// with its key: send it again later with the same ActionID. A 5xx or
	// 409 may come after the server acted, so MaybeProcessed is true.
	// OutcomePending.
	KindGaveUp int32 = 5
	// KindWindowExpired: the action's key is older than the key window
	// (24 hours unless Options.KeyWindowMillis says otherwise), so the
	// server may have forgotten it. Nothing was sent and no new key will
	// ever be made for the action: ask the server what became of it, then
	// Forget it. MaybeProcessed is true. OutcomeRefused.
	KindWindowExpired int32 = 6
	// KindFingerprintMismatch: the ActionID was used before for a request
	// with another method, URL or body. Nothing was sent. This is a bug in
	// the app: one ActionID must always mean one payload. OutcomeRefused.
	KindFingerprintMismatch int32 = 7
	// KindClockSkew: the action's key was made at a time the device's clock
	// now says is more than a minute in the future: the clock was set back
	// since, or ran ahead when the key was made. Nothing was sent and the
	// action is kept; MaybeProcessed is true (an earlier send may have
	// reached the server). If the clock is wrong now, send it again once
	// it is right. If it is right now (it ran ahead when the payment was
	// made), do not wait: the key's real age is unknown, and by the time
	// the clock reaches its time the server may have forgotten it.
	// Reconcile the action with the server (ask it about Key), then
	// Forget it. OutcomeRefused.
	KindClockSkew int32 = 8
	// KindJournal: the journal could not be opened or could not store the
	// key, so nothing was sent: another Client (in this process or another)
	// holds the directory, the disk is full, the directory was removed, or
	// the journal is damaged. The message says which. MaybeProcessed is
	// true when the journal held the action (an earlier send of it may
	// have reached the server) or could not say: resend it with the same
	// ActionID once the journal works again, never as a new action. A full
	// disk refuses new actions only while it lasts: the same Client works
	// again once there is room. A removed directory or a damaged journal
	// needs a new Client. Also a payment (a
	// body of 512 bytes or more) whose check the journal lost
	// (fingerprint.key in dir deleted or damaged): nothing is sent,
	// MaybeProcessed is true, and every resend is refused so until its key
	// window ends (then KindWindowExpired). From Close: the journal could
	// not write what it held, or could not make fingerprint.key again
	// after it was deleted (the message names it); nothing is sent by
	// Close. OutcomeRefused.
	KindJournal int32 = 9
	// KindClosed: the Client was closed, before the call or during it
	// (before anything of the payment was sent). Nothing was sent by this
	// call; for a POST or PATCH with an action, MaybeProcessed is true
	// when an earlier send of it may have reached the server, or the
	// closed journal cannot say. OutcomeRefused.
	KindClosed int32 = 10
	// KindParked: the retry budget set the action aside with its key
	// (many requests were failing at once: an outage). It may have
	// reached the server: resend it later with the same action id, never
	// a new one. (Parked when none of its attempts can have reached the
	// server, it is KindNetwork.) OutcomePending.
	KindParked int32 = 11
	// KindOutcomeUnknown: the action's outcome is unknown for another
	// reason than its key window's end: the server refused its key as used
	// for another payload, or the window ended by a clock more than a day
	// ahead of the device's now (set back since). Nothing more is sent
	// under it: reconcile the action (ask the server about Key), then
	// Forget it. OutcomeRefused.
	KindOutcomeUnknown int32 = 12
)

// kindOutcomes is each kind's outcome, by kind.
var kindOutcomes = [...]int32{
	KindNone: OutcomeDone, KindOther: OutcomePending, KindInvalidRequest: OutcomeRefused,
	KindNetwork: OutcomeNotSent, KindMaybeProcessed: OutcomePending, KindGaveUp: OutcomePending,
	KindWindowExpired: OutcomeRefused, KindFingerprintMismatch: OutcomeRefused, KindClockSkew: OutcomeRefused,
	KindJournal: OutcomeRefused, KindClosed: OutcomeRefused, KindParked: OutcomePending,
	KindOutcomeUnknown: OutcomeRefused,
}

// outcomeOfKind returns kind's outcome; OutcomePending, the safe reading,
// for a kind it does not know.
func outcomeOfKind(kind int32) int32 {
	if kind < 0 || int(kind) >= len(kindOutcomes) {
		return OutcomePending
	}
	return kindOutcomes[kind]
}

// Failure is what an error of this package says, as fields the app can
// branch on. Get it from an error with FailureOf.
type Failure struct {
	// Kind is one of the Kind constants.
	Kind int32
	// MaybeProcessed is true when the server may have performed the
	// action: it must then be sent again with the same ActionID (or
	// reconciled with the server), never as a new action. It is false only
	// when nothing can have reached the server. It is about the action,
	// whatever the kind: a request refused before sending (invalid, or a
	// closed Client) whose action the journal holds, or cannot say about,
	// has it true too.
	MaybeProcessed bool
	// ActionID is the action the error is about, if any.
	ActionID string
	// Key is the Idempotency-Key the action's attempts carried, if known:
	// with it the app can ask the server what became of the action.
	Key string
	// Attempts counts the requests sent for the action, in this run and
	// earlier ones, as far as the journal recorded them (0 when it cannot
	// say: a closed or failed journal); for a request without an action
	// (a GET, say), the requests this Send sent, redirects included.
	// Attempts that failed to connect count too.
	Attempts int32
	// Status is the last HTTP status the server answered, or 0.
	Status int32
	// Message is the error's text, for logs; do not parse it.
	Message string
}

// failure is the error every Client method returns: a Failure and the
// error it classifies, which errors.Is and errors.As reach through Unwrap.
type failure struct {
	f     Failure
	cause error
}

func (e *failure) Error() string { return e.f.Message }
func (e *failure) Unwrap() error { return e.cause }

// FailureOf returns the details of an error returned by this package, or
// null for null. An error from elsewhere (one the app's own Rebuilder
// threw, say) comes back as KindOther with its message.
func FailureOf(err error) *Failure {
	if err == nil {
		return nil
	}
	var e *failure
	if errors.As(err, &e) {
		f := e.f
		return &f
	}
	return &Failure{Kind: KindOther, Message: err.Error()}
}

// ErrorKind returns the kind of an error returned by this package (one of
// the Kind constants): KindNone for null, KindOther for an error from
// elsewhere.
func ErrorKind(err error) int32 {
	if err == nil {
		return KindNone
	}
	return FailureOf(err).Kind
}

// Outcome returns the outcome of f's kind (one of the Outcome constants).
func (f *Failure) Outcome() int32 { return outcomeOfKind(f.Kind) }

// ErrorOutcome returns the outcome of an error returned by this package
// (one of the Outcome constants): OutcomeDone for null, OutcomePending for
// an error from elsewhere.
func ErrorOutcome(err error) int32 { return outcomeOfKind(ErrorKind(err)) }

// newFailure returns a failure of kind with the message "idemretry: msg"
// (msg may carry the prefix already, once or more: it is kept once) that
// unwraps to cause.
func newFailure(kind int32, cause error, msg string) *failure {
	return &failure{f: Failure{Kind: kind, Message: message(msg)}, cause: cause}
}

// message returns "idemretry: msg", the prefix said once however often
// msg carries it, in the mobile API's words (mobileWords), in valid UTF-8
// (a string on both sides of gobind).
func message(msg string) string {
	msg = "idemretry: " + strings.ReplaceAll(strings.TrimPrefix(msg, "idemretry: "), ": idemretry: ", ": ")
	return strings.ToValidUTF8(mobileWords.Replace(msg), "\uFFFD")
}

// mobileWords rewrites the messages of the Go errors that a failure's
// message may quote and that name what a Kotlin or Swift app does not have
// (Go's context, the Transport), in the words of this package's API.
var mobileWords = strings.NewReplacer(
	trimPrefix(root.ErrWaitExceedsDeadline.Error()), "the next retry would come after the timeout (TimeoutMillis)",
	context.DeadlineExceeded.Error(), "timed out",
	// Sends and journal calls end early only at Close.
	context.Canceled.Error(), "cut short by Close",
	trimPrefix(root.ErrFingerprintUncheckable.Error()), "the journal cannot check this payment against its first send: "+
		"fingerprint.key in the journal directory was deleted or damaged, or the record came from another journal directory",
)

// invalid returns a KindInvalidRequest failure wrapping root.ErrInvalidRequest.
func invalid(msg string) *failure {
	return newFailure(KindInvalidRequest, root.ErrInvalidRequest, "invalid request: "+msg)
}

// classify turns an error from the Transport (through http.Client) into a
// failure for actionID: of the kind that the Go package's outcome of it
// (idemretry.OutcomeOf) is, made finer by its reason.
func classify(err error, actionID string) *failure {
	var fe *failure
	if errors.As(err, &fe) {
		return fe
	}
	// http.Client wraps the Transport's error in a *url.Error whose message
	// repeats the method and URL; the Transport's own message says more.
	msgErr := err
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		msgErr = ue.Err
	}
	f := newFailure(KindOther, err, msgErr.Error())
	f.f.ActionID = actionID
	o := root.OutcomeOf(nil, err)
	var ae *root.ActionError
	if errors.As(err, &ae) {
		if ae.Action != "" {
			f.f.ActionID = ae.Action
		}
		f.f.Key = ae.Key
		f.f.Attempts = clampInt32(ae.Attempts)
		f.f.Status = clampInt32(ae.Status)
		f.f.MaybeProcessed = o.MaybeProcessed
	}
	f.f.Kind = kindOf(o, ae != nil)
	if f.f.Kind == KindOutcomeUnknown || f.f.Kind == KindWindowExpired {
		f.f.MaybeProcessed = true
	}
	return f
}

// kindOf is the kind of an error whose outcome is o; action says whether
// the error names an action (an *idemretry.ActionError). In this package
// only Close cancels a Send (its timeout is a deadline): a Send cut by it
// before anything was sent is KindClosed.
func kindOf(o root.Outcome, action bool) int32 {
	closed := errors.Is(o.Reason, context.Canceled)
	switch o.Kind {
	case root.NotSent:
		if closed {
			return KindClosed
		}
		return KindNetwork
	case root.Pending:
		switch {
		case !action && closed:
			return KindClosed // cut before the action was reserved
		case !action:
			return KindOther
		case errors.Is(o.Reason, root.ErrParked):
			return KindParked
		}
		return KindMaybeProcessed
	case root.Refused:
		switch r := o.Reason; {
		case errors.Is(r, root.ErrKeyReused), errors.Is(r, root.ErrOutcomeUnknown):
			return KindOutcomeUnknown
		case errors.Is(r, root.ErrKeyWindowExpired):
			return KindWindowExpired
		case errors.Is(r, root.ErrFingerprintMismatch):
			return KindFingerprintMismatch
		case errors.Is(r, root.ErrClockSkew):
			return KindClockSkew
		case errors.Is(r, root.ErrFingerprintUncheckable):
			// Refused at every resend until its key window ends: the
			// journal lost the secret that checks it.
			return KindJournal
		case errors.Is(r, root.ErrInvalidRequest), errors.Is(r, root.ErrInvalidKey),
			errors.Is(r, root.ErrInvalidAction), errors.Is(r, root.ErrActionRequired),
			errors.Is(r, root.ErrBodyTooLarge), errors.Is(r, root.ErrInvalidOption):
			return KindInvalidRequest
		case isJournalError(r):
			return KindJournal
		}
	case root.Done:
		return KindNone
	}
	return KindOther
}

// isJournalError reports whether err is one of the errors journals return.
func isJournalError(err error) bool {
	for _, s := range []error{journal.ErrClosed, journal.ErrUnavailable, journal.ErrInvalidRecord, journal.ErrIncompatible, journal.ErrNotFound} {
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
	case n < -1<<31:
		return -1 << 31
	}
	return int32(n)
}
