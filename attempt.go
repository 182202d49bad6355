package idemretry

// This file holds the attempt loop: send, classify, wait, go again.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
)

// attempts sends req until the policy calls an outcome final or the retries
// stop. a is nil for methods that carry no key; retry is false for requests
// that must be sent once. pending reports that the action is left unfinished.
// first, if not nil, is the zero attemptTrace the first attempt uses (a
// flight's, to need no allocation of its own).
func (t *Transport) attempts(req *http.Request, b *body, a *action, s settings, first *attemptTrace) (resp *http.Response, pending bool, err error) {
	ctx := req.Context()
	r := &run{t: t, ctx: ctx, a: a, first: first, afterKeyed: a == nil && followsKeyedAnswer(req)}
	bo := s.bo // the default's is made for the first retry: most actions need none
	maxRetries := s.maxRetries
	for n := 0; ; n++ {
		// The window may have ended during the wait (a device asleep, a
		// slow clock): never send a key the server may have forgotten.
		if a != nil && n > 0 && t.windowEndsFor(a, 0) {
			return r.end(journal.StateUnknown, nil, ErrKeyWindowExpired, nil)
		}
		if n == 0 {
			t.budget.deposit()
		}
		if lost := t.checkLease(ctx, a); lost != nil { // lease.go
			return r.end(journal.StatePending, nil, lost, nil)
		}
		// No attempt starts once the caller's context has ended (one
		// without a Done channel could not stop the send at its
		// deadline): one not made cannot have reached the server.
		if err := callerErr(ctx); err != nil {
			return r.end(journal.StatePending, nil, nil, err)
		}
		resp, sent, err := r.send(req, b)
		if !sent {
			if errors.Is(err, errBodyChanged) {
				// The attempt's GetBody copy, in memory, was not the
				// fingerprint's bytes (body.next): it was not sent.
				return r.end(journal.StatePending, nil, ErrFingerprintMismatch, errBodyChanged)
			}
			return r.end(journal.StatePending, nil, nil, err)
		}
		if b.changed() || errors.Is(err, errBodyChanged) {
			// The attempt's GetBody copy, or net/http's own resend's, was
			// not the fingerprint's bytes (body.go: a streamed copy's last
			// byte was held back, an in-memory one was not sent): no
			// attempt sends it.
			r.discard(resp)
			return r.end(journal.StatePending, nil, ErrFingerprintMismatch, errBodyChanged)
		}
		// The answer is judged on its own; the caller's context is checked
		// after, so that a final answer arriving as it ends is still final.
		// Judging may peek at an error body (KeyReuseRejected): a body that
		// stalls is cut after DefaultMaxDrainTime, as a drain would be.
		if final, reused := r.classify(s.policy, resp, err); final {
			return r.finish(resp, err, reused)
		}
		if err != nil && ctx.Err() != nil {
			return r.end(journal.StatePending, nil, nil, err) // the caller's own end, not a give-up
		}
		var wait time.Duration
		reason := ctx.Err()
		if reason == nil {
			if bo == nil && n < maxRetries {
				bo = defaultBackOff()
				bo.Reset()
			}
			wait, reason = t.nextWait(ctx, bo, n, maxRetries, resp)
		}
		if reason == ErrParked {
			// The budget refused: no response is returned, so that a
			// parked action is never mistaken for the server's answer.
			r.discard(resp)
			return r.end(journal.StatePending, nil, reason, err)
		}
		if reason != nil {
			return r.end(journal.StatePending, resp, reason, err)
		}
		if a != nil && t.windowEndsFor(a, wait) {
			r.discard(resp)
			return r.end(journal.StateUnknown, nil, ErrKeyWindowExpired, err)
		}
		r.retrying(resp, err, wait)
		// The discarded answer's drain and the attempt count's journal
		// write came after the wait was checked against the deadline and
		// the window: a wait that no longer fits does not start (the
		// answer is gone).
		if err := callerErr(ctx); err != nil {
			return r.end(journal.StatePending, nil, nil, err) // the caller's own end, not a give-up
		}
		if missesDeadline(ctx, wait) {
			return r.end(journal.StatePending, nil, ErrWaitExceedsDeadline, err)
		}
		if a != nil && t.windowEndsFor(a, wait) {
			return r.end(journal.StateUnknown, nil, ErrKeyWindowExpired, err)
		}
		if err := t.sleep(ctx, wait); err != nil {
			return r.end(journal.StatePending, nil, nil, err)
		}
	}
}

// finish ends the attempts on an outcome the policy called final: an
// error not retried leaves the action pending; an answer that refuses the
// key as reused makes it outcome-unknown (the server holds the key for
// another payload, so this action's own outcome is not known, and the key
// is spent); any other answer is the action's, done.
func (r *run) finish(resp *http.Response, err error, reused bool) (*http.Response, bool, error) {
	switch {
	case err != nil:
		return r.end(journal.StatePending, nil, nil, err)
	case reused:
		r.discard(resp)
		return r.end(journal.StateUnknown, nil, ErrKeyReused, nil)
	}
	return r.end(journal.StateDone, resp, nil, nil)
}

// classify asks the policy whether the attempt's outcome is final and, for
// a final answer, whether it refuses the key as reused; both may read the
// start of an error body, for at most DefaultMaxDrainTime spent reading
// (the policy's own time does not count: a slow policy must not cut the
// body of the answer it lets through).
func (r *run) classify(policy RetryPolicy, resp *http.Response, err error) (final, reused bool) {
	if r.tr != nil && resp != nil && resp.Body != nil && resp.Body != http.NoBody && mayReadBody(policy, resp) {
		jb := &judgedBody{ReadCloser: resp.Body, end: r.tr.cancel, left: DefaultMaxDrainTime}
		resp.Body = jb
		defer func() {
			jb.judged.Store(true)
			if resp.Body == jb { // else wrapped (by peek, say): it reads through
				resp.Body = jb.ReadCloser
			}
		}()
	}
	final = !policy(withoutCancel(r.ctx), resp, err)
	return final, final && err == nil && KeyReuseRejected(resp)
}

// judgedBody is a response's body while the policy judges the response:
// the time spent in its Reads, all together, is bounded by left, after
// which the attempt is ended, which cuts a read that stalls. Once judged,
// it reads through.
type judgedBody struct {
	io.ReadCloser
	end    func()
	left   time.Duration
	timer  *time.Timer
	judged atomic.Bool
}

func (b *judgedBody) Read(p []byte) (int, error) {
	if b.judged.Load() {
		return b.ReadCloser.Read(p)
	}
	if b.left <= 0 {
		b.end()
	}
	start := time.Now()
	if b.timer == nil {
		b.timer = time.AfterFunc(b.left, b.end)
	} else {
		b.timer.Reset(b.left)
	}
	n, err := b.ReadCloser.Read(p)
	b.timer.Stop()
	b.left -= time.Since(start)
	return n, err
}

// mayReadBody reports whether classifying resp with policy may read its
// body: always, with a policy of the caller's; with DefaultRetryPolicy,
// only on the statuses where it and KeyReuseRejected look for a refusal of
// the key (400, 409, 422).
func mayReadBody(policy RetryPolicy, resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
		return true
	}
	return reflect.ValueOf(policy).Pointer() != defaultPolicyPC
}

// defaultPolicyPC identifies DefaultRetryPolicy among policies.
var defaultPolicyPC = reflect.ValueOf(RetryPolicy(DefaultRetryPolicy)).Pointer()

// errNilBackOff refuses, before anything is reserved or sent, a RoundTrip
// whose BackOff factory (WithBackOff, RequestBackOff) returned nil.
var errNilBackOff = fmt.Errorf("%w: the BackOff factory returned nil", ErrInvalidOption)

// startBackOff makes and starts a caller's BackOff, which may count from
// its Reset (an ExponentialBackOff's MaxElapsedTime), so it starts with the
// RoundTrip, before the key is reserved: a factory that returns nil is
// refused with nothing left in the journal. The default's (a nil
// s.newBackOff) counts no time: it is made for the first retry instead
// (most actions need none), and s.bo stays nil.
func (s *settings) startBackOff() error {
	if s.newBackOff == nil {
		return nil
	}
	if s.bo = s.newBackOff(); s.bo == nil {
		return errNilBackOff
	}
	s.bo.Reset()
	return nil
}

// missesDeadline reports whether a wait of d, starting now, would end after
// ctx's deadline.
func missesDeadline(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) < d
}

// nextWait returns how long to wait before attempt n+1, or why there is none.
func (t *Transport) nextWait(ctx context.Context, bo backoff.BackOff, n, maxRetries int, resp *http.Response) (time.Duration, error) {
	if n >= maxRetries || bo == nil {
		return 0, ErrAttemptsExhausted
	}
	wait := bo.NextBackOff()
	if wait == backoff.Stop {
		return 0, ErrAttemptsExhausted
	}
	if ra, ok := RetryAfter(resp, t.cfg.clock.Now()); ok {
		if ra > t.cfg.maxRetryAfter {
			return 0, ErrRetryAfterTooLong
		}
		// Retry-After is a floor; the drawn wait spreads the clients that
		// were all told the same time above it, instead of bringing them
		// back at once.
		wait = addDuration(wait, ra)
	}
	if missesDeadline(ctx, wait) {
		return 0, ErrWaitExceedsDeadline
	}
	if !t.budget.withdraw() {
		return 0, ErrParked
	}
	return wait, nil
}

// run is the state of one RoundTrip's attempts.
type run struct {
	t     *Transport
	ctx   context.Context
	a     *action // nil without a key
	sent  int
	maybe bool // an attempt may have reached the server
	// afterKeyed: the request, sent without a key, follows a redirect
	// answered to a keyed request (a GET to a 303's receipt): whatever
	// becomes of it, the server has answered that one, and may have
	// performed it.
	afterKeyed bool
	lastStatus int // of the previous attempt: 0 if none, or a transport error
	lastErr    error
	out        *http.Request // the last attempt's request
	// tr is the last attempt's trace, whose end cancels the attempt's
	// context: it cuts a stalled read of its body. (Closing the body
	// instead would not do for every base: an *http.Transport may hand a
	// scheme to a RoundTripper registered with RegisterProtocol, whose
	// body's Close may wait for the read.)
	tr    *attemptTrace
	first *attemptTrace // for the first attempt, if given
}

// send makes one attempt. Its context is the caller's, with a trace that
// tells whether the request was written (net/http may resend a request with
// an Idempotency-Key on a new connection by itself, and report only that
// resend's dial error), and a cancel that bounds the drain of a discarded
// body.
func (r *run) send(req *http.Request, b *body) (_ *http.Response, sent bool, _ error) {
	// Each attempt counts its own writes: a write of an earlier attempt
	// reported late must not count for this one. Each has its own request
	// copy too, in the same allocation: the base may still hold the last
	// attempt's.
	tr := r.first
	if tr != nil {
		r.first = nil
	} else {
		tr = new(attemptTrace)
	}
	tr.trace.WroteRequest = tr.wrote
	writes := &tr.writes
	tr.req = *req.WithContext(tr.context(r.ctx))
	out, err := r.t.newAttempt(&tr.req, b, r.wireKey(), tr.vals[:])
	if err != nil {
		tr.end()
		return nil, false, err
	}
	r.out, r.tr = out, tr
	var start time.Time
	timed := len(r.t.cfg.observers) > 0 // Elapsed is for the observers alone
	if timed {
		start = time.Now()
	}
	resp, err := r.t.base.RoundTrip(out)
	// Requests written, as far as the base reports them: a base that
	// retries by itself (stacked retries), or net/http's own resend, writes
	// more than one per attempt.
	w := writes.Load()
	n := max(1, int(w))
	r.sent += n
	r.t.counters.attempts.Add(int64(n))
	if timed {
		// Only the observers hear of an attempt (emit counts none): with
		// none, no Event is made.
		defer func() {
			r.t.emit(r.ctx, Event{Kind: EventAttempt, Action: r.id(), Key: r.key(), Attempt: r.total(),
				Requests: n, Status: r.lastStatus, Err: r.lastErr, Elapsed: time.Since(start)})
		}()
	}
	if err == nil && resp == nil {
		err = errors.New("idemretry: base RoundTripper returned neither response nor error")
	}
	r.lastStatus = statusOf(resp)
	if err != nil && resp != nil { // a broken base, or one giving up: keep the error and the status, free the response
		r.discard(resp)
		resp = nil
	}
	// A dial error says that nothing was written only from a base that
	// was told of this attempt's writes: one that looked up its trace (a
	// base that sends tries of its own, without the attempt's context,
	// may have written an earlier one).
	told := tr.flags.Load()&traced != 0 || clientTraceKey == nil
	r.maybe = r.maybe || resp != nil || w > 0 || !told || mayHaveReachedServer(err)
	if r.maybe && r.a != nil && r.a.resumed != nil {
		r.a.resumed.sent.Store(true)
	}
	r.lastErr = err
	if err != nil {
		tr.end()
	}
	return resp, true, err
}

// attemptTrace is one attempt's httptrace hooks, the count of the
// requests they saw written, its request, and the wrapper of its
// response's body if it is returned, in one allocation.
type attemptTrace struct {
	trace httptrace.ClientTrace
	// writes counts the requests the base wrote (WroteRequest).
	writes atomic.Int32
	// flags: bodyRead, the body of the response returned to the caller
	// was read to its end, and so closed (attemptBody); traced, the base
	// looked up the attempt's trace (see run.send).
	flags atomic.Uint32
	req   http.Request
	// resp is the body of the response returned to the caller, which
	// the caller reads through the attemptTrace itself (attemptBody), so
	// that closing it ends the attempt's context.
	resp io.ReadCloser
	// vals holds the values of the request's header copy when they fit:
	// the key and four more (most requests carry a handful of headers;
	// the rest get one array of their own). Five keep a flight, which
	// holds its first attemptTrace, within 896 bytes (eight took it to
	// the next size class, 1024: 128 bytes more per action).
	vals [5]string
	// parent is the caller's context, when the attemptTrace is itself the
	// attempt's context (see withTrace).
	parent context.Context
	// cancel ends the attempt's context (see context and end).
	cancel context.CancelFunc
	// act is the action of the response this attempt got, when it is
	// returned (nil without a key): what OutcomeOf reads through the
	// response's request (see run.end).
	act *action
}

func (a *attemptTrace) wrote(httptrace.WroteRequestInfo) { a.writes.Add(1) }

// The flags of an attemptTrace. traced is set when the base looks up the
// attempt's trace, as net/http does for every request it is given: only
// then can the count of writes say that none was made.
const (
	bodyRead uint32 = 1 << iota
	traced
)

// discard drains and closes a response that is not returned: at most
// maxDrain bytes, for at most DefaultMaxDrainTime (a body that stalls is
// cut by cancelling its attempt, which drops the connection).
func (r *run) discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		if r.tr != nil {
			r.tr.end()
		}
		return
	}
	if r.tr != nil {
		stop := time.AfterFunc(DefaultMaxDrainTime, r.tr.cancel)
		defer func() { stop.Stop(); r.tr.end() }()
	}
	_, _ = io.CopyN(io.Discard, resp.Body, r.t.cfg.maxDrain)
	resp.Body.Close()
}

// wireKey is the key header's value of the run's attempts: the action's
// key in its record's form (see Transport.quotedForm), or "" without one.
func (r *run) wireKey() string {
	if r.a == nil {
		return ""
	}
	return formatKey(r.a.rec.Key, r.t.quotedForm(r.a.rec.KeyForm))
}

// newAttempt clones req for one attempt, with a fresh body and key, the
// key header's value (wireKey's), unless it is empty; the header's values
// go in vals if they fit.
func (t *Transport) newAttempt(req *http.Request, b *body, key string, vals []string) (*http.Request, error) {
	if err := t.keyless(req, key); err != nil { // keyjournal.go
		return nil, err
	}
	r, get, err := b.next()
	if err != nil {
		return nil, fmt.Errorf("idemretry: rewind request body: %w", err)
	}
	// A shallow copy (req is already one, with the attempt's context) with
	// its own header: the base RoundTripper must not modify the request, so
	// only the header, which gets the key, needs copying.
	out := req
	drop := "" // the key's header, under any spelling, when the key is set
	if key != "" {
		drop = t.cfg.header
	}
	var spare []string
	out.Header, spare = cloneHeader(req.Header, drop, vals)
	out.Body, out.GetBody = r, get // the base's own resends are checked too
	if key != "" {
		spare[0] = key
		out.Header[t.cfg.header] = spare
	}
	return out, nil
}

// cloneHeader is http.Header.Clone in one pass over h (each value slice
// capped at its length), never nil and with room for one more header,
// without the headers named drop under any spelling (none if drop is ""),
// for which it returns spare, of length 1, so that the key's value costs no
// allocation of its own. The values go in vals while they fit (vals must
// be zero and not used otherwise), then in arrays of their own.
func cloneHeader(h http.Header, drop string, vals []string) (_ http.Header, spare []string) {
	free := vals
	if drop != "" {
		if len(free) == 0 {
			free = make([]string, 1+2*len(h))
		}
		spare, free = free[:1:1], free[1:]
	}
	h2 := make(http.Header, len(h)+1)
	for k, vv := range h {
		if drop != "" && strings.EqualFold(k, drop) {
			continue
		}
		if vv == nil {
			h2[k] = nil // as Clone keeps them
			continue
		}
		if len(vv) > len(free) {
			free = make([]string, max(len(vv), 2*len(h)))
		}
		n := copy(free, vv)
		h2[k] = free[:n:n]
		free = free[n:]
	}
	return h2, spare
}

// sleep waits d on the Transport's clock, or until ctx is done.
func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := t.cfg.newTimer()
	timer.Start(d)
	defer timer.Stop()
	select {
	case <-timer.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mayHaveReachedServer is false only for errors raised before a connection
// existed: failing to resolve or to connect. Anything later may have
// delivered the request. It is the fallback for base RoundTrippers that
// look up the attempt's trace and do not report writes through it.
func mayHaveReachedServer(err error) bool {
	if err == nil {
		return true
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return false
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return false
	}
	return true
}
