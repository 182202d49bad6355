package idemretry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/idemretry/idemretry/journal"
)

// Transport is an http.RoundTripper that retries requests safely. Each
// request with a keyed method (POST and PATCH by default) belongs to a
// logical action and carries that action's Idempotency-Key on every attempt;
// the key is durable in the journal.Journal before the first attempt leaves the
// process. GET, HEAD, OPTIONS, TRACE, PUT and DELETE are retried under the
// same policy without a key; any other method is sent once. A key the caller
// sets on a method that is not keyed is passed through as it is, unchecked
// and not journaled.
//
// How one RoundTrip goes: resolve the action (the caller's own
// Idempotency-Key header; else WithAction's id; else a fingerprint of method,
// URL and body, matched against unfinished actions only), reserve its key, then
// attempt, classify the outcome with the RetryPolicy, and either return or
// wait (full jitter, or a longer Retry-After up to its cap) and go again. No
// wait starts that would end after the context's deadline or the key window.
//
// The caller's request is never modified. RoundTrip closes the request body,
// as http.RoundTripper requires, and drains and closes every response it
// discards; the caller closes the response it returns. A Transport is safe for
// concurrent use; requests of one action from several goroutines share one
// flight (see RoundTrip), so a double tap sends one request, not two keys
// nor a 409 storm.
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

// NewTransport returns a Transport that sends through base (if nil, its own
// clone of http.DefaultTransport, so that Close affects no one else). Unless
// WithJournal gives one, it opens the file journal in WithJournalDir's
// directory or filejournal.DefaultDir, owns it and closes it in Close;
// opening fails with an error wrapping filejournal.ErrLocked if another
// Transport or process holds that journal.
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
// reconciliation at start-up (journal.Journal.Unfinished, journal.Journal.Forget).
func (t *Transport) Journal() journal.Journal {
	t.journalHandedOut.Store(true)
	return t.journal
}

// Close writes the outcomes that the journal could not record when they
// came (see WithJournalTimeout), closes the journal if the Transport opened
// it, and closes the base transport's idle connections. Requests in flight
// may fail afterwards. An outcome that still cannot be written is reported
// in the error (and lost with the process: its action is then resent with
// its old key, or, if it was named by its fingerprint and done, reconciled).
func (t *Transport) Close() error {
	t.CloseIdleConnections()
	err := t.landAll()
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

// RoundTrip implements http.RoundTripper. It returns a response or an error,
// never both. A response is returned as soon as the RetryPolicy calls it
// final, or, when the retries stop (attempts used up, a Retry-After beyond
// its cap, a deadline the next wait would miss, the caller's context ended),
// the last response with its body unread; GiveUpReason tells the two apart.
//
// A keyed request that arrives while a request of the same action is in
// flight in this Transport (the same caller key, WithAction id, or, for an
// unnamed request, the same method, URL and body) sends nothing: it waits
// for that flight, bounded by its own context, and gets its own copy of the
// result, its body read into memory up to the sharing limit
// (WithMaxSharedResponse; a larger body stays the first caller's, and the
// others get ErrResponseNotShared). If the first caller's context ends with
// the action unfinished, one of the waiting callers carries it on, with the
// same key. A flight runs with its leader's settings: the WithRequestOptions
// of a caller that joins it do not apply to it.
//
// Errors: before sending, ErrInvalidRequest, ErrInvalidKey, ErrInvalidAction,
// ErrActionRequired, ErrBodyTooLarge or a journal error (journal.ErrClosed,
// journal.ErrUnavailable, ...); for an action, an *ActionError that names it,
// its key and its attempts, and unwraps to the reason (ErrKeyWindowExpired,
// ErrFingerprintMismatch, ErrAttemptsExhausted, ErrWaitExceedsDeadline,
// ErrParked, ErrKeyReused, ErrResponseNotShared, ErrLeaseHeld,
// ErrLeaseLost) and the last cause.
//
// Waits: every wait ends with the caller's context, except that recording
// the outcome in the journal may take up to OutcomeGrace longer, and
// releasing the action's lease (journal.Leaser) up to a second more; no
// journal call lasts longer than the journal timeout (WithJournalTimeout);
// a discarded response body is drained for at most DefaultMaxDrainTime.
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
				Reason: ErrFingerprintMismatch, Err: fmt.Errorf("rebuilt with method %s, which is sent without a key", method)}
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
		return nil, err
	}
	ctx := req.Context()
	for {
		f, lead, mismatch := t.flights.join(who.id, who.fp)
		switch {
		case mismatch:
			// The leader's fingerprint may be keyed, with a salt of
			// its own: computed so, the two may be one payload.
			fp, same, err := t.samePayload(payload{req, b}, &who, f.fp)
			if err != nil { // the body read again, or a keyed fingerprint that cannot be checked
				return nil, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Err: err}
			}
			if !same {
				return nil, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Reason: ErrFingerprintMismatch}
			}
			who.fp = fp
			continue
		case lead:
			return t.lead(req, b, who, f, s)
		case t.flights.reconciling(f):
			// Resume is asking the app about this action's outcome:
			// it is outcome-unknown, and nothing of it is sent.
			return nil, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Reason: ErrOutcomeUnknown}
		}
		if err := f.wait(ctx); err != nil {
			return nil, &ActionError{Action: who.id, Key: t.flights.keyOf(f), MaybeProcessed: true, Err: err}
		}
		if !f.again {
			if m := who.resumed; m != nil {
				if k := t.flights.keyOf(f); k != "" && k != m.rec.Key {
					// Resume's action is not this flight's: a new one
					// with the same payload replaced it.
					return nil, notResumableError(who.id, &m.rec, nil)
				}
			}
			return f.result()
		}
	}
}

// lead makes the flight's attempts and shares their result with the
// callers that joined. If the leader's own context ended (or its deadline
// cut the retries short) with the action unfinished, a waiting caller
// carries it on instead. A panic (in a policy, a hook, the journal) still
// lands the flight, so that its joiners and later requests are not stranded.
func (t *Transport) lead(req *http.Request, b *body, who identity, f *flight, s settings) (resp *http.Response, err error) {
	shared := false
	defer func() {
		if !shared {
			t.flights.land(f)
			f.fail(fmt.Errorf("idemretry: the request leading action %q panicked", who.id))
		}
	}()
	var pending bool
	a, err := t.reserveLeased(req.Context(), who, payload{req, b}, s.keyWindow, &f.act) // lease.go: one machine in flight per action
	defer t.releaseLease(a)
	if err == nil {
		t.flights.setKey(f, a.rec.Key)
		resp, pending, err = t.attempts(req, b, a, s, &f.trace)
	}
	n := t.flights.land(f)
	shared = true
	// A refusal that is Resume's alone (its listed key is not the
	// action's any more) is not the joiners': one of them carries on.
	again := cutShort(req.Context(), resp, err, pending) || (who.resumed != nil && errors.Is(err, ErrNotResumable))
	return f.share(who.id, n, t.cfg.maxShared, resp, err, again)
}

// cutShort reports whether a flight ended unfinished because of its
// leader's own context, which its joiners do not share.
func cutShort(ctx context.Context, resp *http.Response, err error, pending bool) bool {
	if !pending && resp != nil {
		return false
	}
	return callerEnded(ctx) || errors.Is(err, ErrWaitExceedsDeadline) || errors.Is(GiveUpReason(resp), ErrWaitExceedsDeadline)
}

// idempotentMethods may be retried without a key (RFC 9110, 9.2.2).
var idempotentMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true,
	http.MethodPut: true, http.MethodDelete: true,
}

var _ http.RoundTripper = (*Transport)(nil)
