package idemretry

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/idemretry/idemretry/journal"
)

// Transport is an [http.RoundTripper] that retries requests safely.
//
// Each request with a keyed method (POST and PATCH by default) belongs to a
// logical action. It carries that action's Idempotency-Key on every
// attempt. The key is durable in the [journal.Journal] before the first
// attempt leaves the process. GET, HEAD, OPTIONS, TRACE, PUT and DELETE are
// retried under the same policy without a key. Any other method is sent
// once. A key the caller sets on a method that is not keyed is passed
// through as it is, unchecked and not journaled.
//
// One RoundTrip first resolves the action. The action is named by its
// [WithAction] id, which keeps its first key whatever key later requests
// carry; else by the caller's own Idempotency-Key header; else by a
// fingerprint of method, URL and body, matched against unfinished actions
// only. RoundTrip then reserves the action's key and sends an attempt. The
// [RetryPolicy] classifies the outcome: RoundTrip returns, or waits (full
// jitter, or a longer Retry-After up to its cap) and goes again. No wait
// starts that would end after the context's deadline or the key window.
//
// The caller's request is never modified. RoundTrip closes the request
// body, as [http.RoundTripper] requires. It drains and closes every
// response it discards; the caller closes the response it returns. A keyed
// request with GetBody sends a GetBody copy on every attempt, the first
// too, as its fingerprint is read from one (a GetBody may share its reader
// with Body, as openai-go's does): its Body is closed unread.
//
// A Transport is safe for concurrent use. Requests of one action from
// several goroutines share one flight (see [Transport.RoundTrip]): a double
// tap sends one request, not two keys nor a 409 storm.
type Transport struct {
	base        http.RoundTripper
	cfg         config
	journal     journal.Journal
	ownsJournal bool
	flights     flights
	unlanded    unlanded
	hops        hopIDs // reserve.go
	budget      *budget
	leases      leases // lease.go
	counters    counters
	// journalHandedOut: Journal was called, so the app may use the journal
	// after dropping the Transport: it is then not closed when the
	// Transport is collected (see openJournal).
	journalHandedOut *atomic.Bool
	// journalNonBlocking: the journal says its calls never block
	// (journal.NonBlocker), asked once.
	journalNonBlocking bool
	// timeouts: the journal timeout's shared bounds (journaltimeout.go).
	timeouts sharedTimeouts
	// leasing: the journal is a journal.Leaser, asked once; without one no
	// lease is ever held, and the attempts skip the lease table (lease.go).
	leasing bool
	// fpKey: of the keyed fingerprints, from the journal's secret; set by
	// NewTransport, never changed.
	fpKey fpKey
}

// NewTransport returns a Transport that sends through base. A nil base is
// the Transport's own clone of [http.DefaultTransport], so that
// [Transport.Close] affects no one else.
//
// Unless [WithJournal] gives a journal, NewTransport opens the file journal
// in [WithJournalDir]'s directory or [filejournal.DefaultDir]. The
// Transport owns that journal and closes it in Close. If another Transport
// or process holds the journal, NewTransport fails with an error wrapping
// [filejournal.ErrLocked].
func NewTransport(base http.RoundTripper, opts ...Option) (*Transport, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if base == nil {
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			base = dt.Clone()
		} else {
			base = http.DefaultTransport
		}
	}
	t := &Transport{base: base, cfg: cfg, journal: cfg.journal, budget: cfg.budget, journalHandedOut: new(atomic.Bool)}
	t.counters.init(t)
	if t.journal == nil {
		if err := t.openJournal(); err != nil {
			return nil, err
		}
	}
	t.journalNonBlocking = neverBlocks(t.journal)
	t.fpKey = fingerprintKey(t.journal)
	_, t.leasing = t.journal.(journal.Leaser)
	t.logClock()
	return t, nil
}

// Journal returns the journal the Transport keeps keys in, for
// reconciliation at start-up ([journal.Journal.Unfinished],
// [journal.Journal.Forget]).
func (t *Transport) Journal() journal.Journal {
	t.journalHandedOut.Store(true)
	return t.journal
}

// Close closes the base transport's idle connections. It writes the
// outcomes that the journal could not record when they came (see
// [WithJournalTimeout]). It waits for the releases of actions' leases still
// under way, at most a second (see [WithLeaseTTL]). It closes the journal if
// the Transport opened it. Requests in flight may fail afterwards.
//
// An outcome that still cannot be written is reported in the error. It is
// lost with the process: its action is then resent with its old key or, if
// it was named by its fingerprint and done, reconciled.
func (t *Transport) Close() error {
	t.CloseIdleConnections()
	err := t.landAll()
	t.leases.close() // lease.go: the releases under way end first, within leaseReleaseTimeout
	if t.ownsJournal {
		err = errors.Join(err, t.journal.Close())
	}
	return err
}

// CloseIdleConnections closes the base transport's idle connections, if it
// can; http.Client.CloseIdleConnections calls it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip implements [http.RoundTripper]. It returns a response or an
// error, never both. It returns a response as soon as the [RetryPolicy]
// calls it final. When the retries stop (attempts used up, a Retry-After
// beyond its cap, a deadline the next wait would miss, the caller's context
// ended), it returns the last response with its body unread. [GiveUpReason]
// tells the two apart.
//
// A keyed request may arrive while a request of the same action is in
// flight in this Transport: the same caller key, [WithAction] id or, for an
// unnamed request, the same method, URL and body. It sends nothing. It
// waits for that flight, bounded by its own context, and gets its own copy
// of the result. The copy's body is read into memory up to the sharing
// limit ([WithMaxSharedResponse]). A larger body, and a 101 Switching
// Protocols, stay the first caller's; the others get
// [ErrResponseNotShared].
//
// The request takes the copy only if it asks as the flight's first caller
// does (the same Authorization, Cookie, API-key and account headers); one
// that asks as another is sent itself, once the flight has landed, under
// the action's key. And it takes the copy only if the
// flight's action is one it would itself have reserved. An unnamed request may find the flight resending an
// action already done (a tap within the duplicate window, or Resume) after
// the duplicate window ended. It is then a new payment, sent once that
// flight has landed. If the first caller's context ends before the waiting
// callers have the answer (the action unfinished, or its body still being
// read for them), one of them carries the action on, with the same key. A
// flight runs with its leader's settings: the [WithRequestOptions] of a
// caller that joins it do not apply to it.
//
// Errors before sending are [ErrInvalidRequest], [ErrInvalidKey],
// [ErrInvalidAction], [ErrActionRequired], [ErrBodyTooLarge] or a journal
// error ([journal.ErrClosed], [journal.ErrUnavailable],
// [journal.ErrCorruptRecord] for a stored record that [journal.CheckRecord]
// refuses, ...). An error for an action is an [*ActionError]. It names the
// action, its key and its attempts. It unwraps to the reason
// ([ErrKeyWindowExpired], [ErrFingerprintMismatch], [ErrAttemptsExhausted],
// [ErrWaitExceedsDeadline], [ErrParked], [ErrKeyReused],
// [ErrResponseNotShared], [ErrLeaseHeld], [ErrLeaseLost]) and to the last
// cause.
//
// Every wait ends with the caller's context, with one exception: recording
// the outcome in the journal may take up to [OutcomeGrace] longer. The
// action's lease ([journal.Leaser]) is released after RoundTrip returns. No
// journal call lasts longer than the journal timeout
// ([WithJournalTimeout]). A discarded response body is drained for at most
// [DefaultMaxDrainTime].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if ch := cancelChannel(req); ch != nil {
		return t.roundTripCancel(req, ch) // attemptctx.go: the channel ends the context
	}
	if req == nil || req.URL == nil || req.URL.Host == "" {
		if req != nil && req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("%w: nil request, URL or host", ErrInvalidRequest)
	}
	bv, err := newBody(req, t.cfg.maxBuffered)
	if err != nil {
		return nil, err
	}
	b := &bv
	defer b.close()

	s, err := t.settingsFor(req.Context())
	if err == nil {
		err = s.startBackOff()
	}
	if err != nil {
		return nil, err
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !t.cfg.keyed[method] {
		if m, ok := req.Context().Value(resumeKey{}).(*resumeMark); ok {
			// Resume's action carries a key; a rebuilt request whose
			// method carries none is not that action's request.
			rec := m.rec
			return nil, &ActionError{Action: rec.ActionID, Key: rec.Key, Attempts: rec.Attempts, MaybeProcessed: true,
				Reason: ErrFingerprintMismatch, Err: fmt.Errorf("rebuilt with method %s, which is sent without a key", method), counted: true}
		}
		// Without a key, only a method that is idempotent by definition may
		// be sent twice; any other is sent once.
		if !idempotentMethods[method] {
			s.maxRetries = 0
		}
		resp, _, err := t.attempts(req, b, nil, s, nil)
		return resp, err
	}
	who, err := t.identify(req, b)
	if err != nil {
		return nil, sentNothing(err)
	}
	resp, err := t.fly(req, b, who, s) // lifecycle.go
	return resp, sentNothing(err)
}

// idempotentMethods may be retried without a key (RFC 9110, 9.2.2).
var idempotentMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true,
	http.MethodPut: true, http.MethodDelete: true,
}

var _ http.RoundTripper = (*Transport)(nil)
