package idemretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
)

// attempts sends req until the policy calls an outcome final or the retries
// stop. a is nil for methods that carry no key; retry is false for requests
// that must be sent once. pending reports that the action is left unfinished.
func (t *Transport) attempts(req *http.Request, b *body, a *action, retry bool) (resp *http.Response, pending bool, err error) {
	ctx := req.Context()
	r := &run{t: t, ctx: ctx, a: a}
	bo := t.cfg.newBackOff()
	bo.Reset()
	maxRetries := t.cfg.maxRetries
	if !retry {
		maxRetries = 0
	}
	for n := 0; ; n++ {
		// The window may have ended during the wait (a device asleep, a
		// slow clock): never send a key the server may have forgotten.
		if a != nil && n > 0 && t.windowEndsFor(a, 0) {
			return r.end(journal.StateUnknown, nil, ErrKeyWindowExpired, nil)
		}
		resp, sent, err := r.send(req, b)
		if !sent {
			return r.end(journal.StatePending, nil, nil, err)
		}
		// The answer is judged on its own; the caller's context is checked
		// after, so that a final answer arriving as it ends is still final.
		if !t.cfg.policy(context.WithoutCancel(ctx), resp, err) {
			if err != nil {
				return r.end(journal.StatePending, nil, nil, err)
			}
			return r.end(journal.StateDone, resp, nil, nil)
		}
		if err != nil && ctx.Err() != nil {
			return r.end(journal.StatePending, nil, nil, err) // the caller's own end, not a give-up
		}
		var wait time.Duration
		reason := ctx.Err()
		if reason == nil {
			wait, reason = t.nextWait(ctx, bo, n, maxRetries, resp)
		}
		if reason != nil {
			return r.end(journal.StatePending, resp, reason, err)
		}
		if a != nil && t.windowEndsFor(a, wait) {
			r.discard(resp)
			return r.end(journal.StateUnknown, nil, ErrKeyWindowExpired, err)
		}
		r.retrying(resp, err, wait)
		if err := t.sleep(ctx, wait); err != nil {
			return r.end(journal.StatePending, nil, nil, err)
		}
	}
}

// nextWait returns how long to wait before attempt n+1, or why there is none.
func (t *Transport) nextWait(ctx context.Context, bo backoff.BackOff, n, maxRetries int, resp *http.Response) (time.Duration, error) {
	if n >= maxRetries {
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
		wait = max(wait, ra)
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
		return 0, ErrWaitExceedsDeadline
	}
	return wait, nil
}

// run is the state of one RoundTrip's attempts.
type run struct {
	t          *Transport
	ctx        context.Context
	a          *action // nil without a key
	sent       int
	maybe      bool // an attempt may have reached the server
	lastStatus int  // of the previous attempt: 0 if none, or a transport error
	lastErr    error
	out        *http.Request // the last attempt's request
	cancel     context.CancelFunc
}

// send makes one attempt. Its context is the caller's, with a trace that
// tells whether the request was written (net/http may resend a request with
// an Idempotency-Key on a new connection by itself, and report only that
// resend's dial error), and a cancel that bounds the drain of a discarded
// body.
func (r *run) send(req *http.Request, b *body) (_ *http.Response, sent bool, _ error) {
	var wrote atomic.Bool
	ctx, cancel := context.WithCancel(httptrace.WithClientTrace(r.ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
	}))
	out, err := r.t.newAttempt(req.WithContext(ctx), b, r.key())
	if err != nil {
		cancel()
		return nil, false, err
	}
	r.out, r.cancel = out, cancel
	resp, err := r.t.base.RoundTrip(out)
	r.sent++
	if err == nil && resp == nil {
		err = errors.New("idemretry: base RoundTripper returned neither response nor error")
	}
	if err != nil && resp != nil { // a broken base: keep the error, free the response
		r.discard(resp)
		resp = nil
	}
	r.maybe = r.maybe || resp != nil || wrote.Load() || mayHaveReachedServer(err)
	r.lastStatus, r.lastErr = statusOf(resp), err
	if err != nil {
		cancel()
	}
	return resp, true, err
}

// retrying reports a retry about to happen and frees the attempt.
func (r *run) retrying(resp *http.Response, err error, wait time.Duration) {
	t := r.t
	ev := RetryEvent{Action: r.id(), Key: r.key(), Attempt: r.prior() + r.sent, Wait: wait, Status: statusOf(resp), Err: err}
	if t.cfg.onRetry != nil {
		t.cfg.onRetry(ev)
	}
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(r.ctx, slog.LevelDebug, "idemretry: retrying", slog.String("action", ev.Action),
			slog.String("key", ev.Key), slog.Int("attempt", ev.Attempt), slog.Duration("wait", ev.Wait),
			slog.Int("status", ev.Status), slog.Any("error", ev.Err))
	}
	r.discard(resp)
	if r.sent == 1 && r.a != nil {
		r.t.progress(r.ctx, r.record(journal.StatePending, 0)) // a crash during the waits keeps the count
	}
}

// end records where the action stands and returns what RoundTrip returns:
// resp if there is one (a final answer, or the last retryable one when the
// retries stop for reason), else an *ActionError. What the caller is given
// is what the journal records: done only with a final answer in hand.
// pending reports that the action is left unfinished.
func (r *run) end(state journal.State, resp *http.Response, reason, cause error) (_ *http.Response, pending bool, _ error) {
	t := r.t
	if r.a != nil {
		rec := r.record(state, 0)
		if state == journal.StateDone {
			rec.Status = statusOf(resp)
		}
		if r.a.rec.State == journal.StateDone {
			// Done is final: a resend that failed does not make a known
			// outcome unknown, nor does a replay change it.
			rec.State, rec.Status = journal.StateDone, r.a.rec.Status
		}
		// A fingerprint-named action's new done must be durable before
		// RoundTrip returns: lost, a deliberate repeat after a crash would
		// reuse the old key and be answered with this payment's replay.
		if rec.State == journal.StatePending {
			t.progress(r.ctx, rec)
		} else {
			t.record(r.ctx, rec, rec.State == journal.StateDone && r.a.byFingerprint && r.a.rec.State != journal.StateDone)
		}
		if rec.State == journal.StateUnknown {
			t.logUnknown(r.ctx, rec)
		}
		state = rec.State
	}
	if reason != nil {
		t.logGiveUp(r.ctx, r.id(), r.key(), r.prior()+r.sent, r.lastStatus, reason, cause)
	}
	if resp != nil {
		if reason != nil {
			markGiveUp(resp, r.out, reason)
		}
		if resp.Body != nil {
			resp.Body = &cancelOnClose{resp.Body, r.cancel}
		}
		return resp, state != journal.StateDone, nil
	}
	if r.cancel != nil {
		r.cancel()
	}
	if reason == ErrKeyWindowExpired && cause == nil {
		cause = r.lastErr
	}
	return nil, state != journal.StateDone, &ActionError{Action: r.id(), Key: r.key(), Attempts: r.prior() + r.sent, Status: r.lastStatus,
		MaybeProcessed: r.maybe || (r.a != nil && (!r.a.fresh || r.prior() > 0)), Reason: reason, Err: cause}
}

// cancelOnClose ends a returned response's attempt context when the caller
// closes its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// record returns the action's record as it stands after this run.
func (r *run) record(state journal.State, status int) journal.Record {
	rec := r.a.rec
	rec.State, rec.Attempts, rec.Status = state, r.prior()+r.sent, status
	return rec
}

func (r *run) id() string {
	if r.a == nil {
		return ""
	}
	return r.a.rec.ActionID
}

func (r *run) key() string {
	if r.a == nil {
		return ""
	}
	return r.a.rec.Key
}

func (r *run) prior() int {
	if r.a == nil {
		return 0
	}
	return r.a.rec.Attempts
}

// discard drains and closes a response that is not returned: at most
// maxDrain bytes, for at most DefaultMaxDrainTime (a body that stalls is
// cut by cancelling its attempt, which drops the connection).
func (r *run) discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		if r.cancel != nil {
			r.cancel()
		}
		return
	}
	if r.cancel != nil {
		stop := time.AfterFunc(DefaultMaxDrainTime, r.cancel)
		defer func() { stop.Stop(); r.cancel() }()
	}
	_, _ = io.CopyN(io.Discard, resp.Body, r.t.cfg.maxDrain)
	resp.Body.Close()
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// newAttempt clones req for one attempt, with a fresh body and the key.
func (t *Transport) newAttempt(req *http.Request, b *body, key string) (*http.Request, error) {
	r, err := b.next()
	if err != nil {
		return nil, fmt.Errorf("idemretry: rewind request body: %w", err)
	}
	// A shallow copy (req is already one, with the attempt's context) with
	// its own header: the base RoundTripper must not modify the request, so
	// only the header, which gets the key, needs copying.
	out := req
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = make(http.Header, 1)
	}
	out.Body, out.GetBody = r, b.getBody
	if key != "" {
		deleteHeader(out.Header, t.cfg.header)
		out.Header[t.cfg.header] = []string{formatKey(key, t.cfg.quoted)}
	}
	return out, nil
}

// sleep waits d on the Transport's clock, or until ctx is done.
func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := t.cfg.clock.NewTimer()
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
// delivered the request. It is the fallback for base RoundTrippers that do
// not report writes through httptrace.
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
