package idemretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// attempts sends req until the policy calls an outcome final or the retries
// stop. a is nil for methods that carry no key; retry is false for requests
// that must be sent once.
func (t *Transport) attempts(req *http.Request, b *body, a *action, retry bool) (*http.Response, error) {
	ctx := req.Context()
	bo := t.cfg.newBackOff()
	bo.Reset()
	var (
		actionID, key string
		prior         int
		sent          int
		maybe         bool // an attempt may have reached the server
	)
	if a != nil {
		actionID, key, prior = a.rec.ActionID, a.rec.Key, a.rec.Attempts
	}
	maxRetries := t.cfg.maxRetries
	if !retry {
		maxRetries = 0
	}
	fail := func(status int, reason, cause error) error {
		return &ActionError{Action: actionID, Key: key, Attempts: prior + sent, Status: status,
			MaybeProcessed: maybe || (a != nil && (!a.fresh || prior > 0)), Reason: reason, Err: cause}
	}
	// finish records where the action stands when RoundTrip returns. An
	// action already done stays done: a resend that failed does not make
	// its known outcome unknown.
	finish := func(state State, status int) {
		if a == nil {
			return
		}
		rec := a.rec
		if rec.State == StateDone && state != StateDone {
			state, status = StateDone, rec.Status
		}
		rec.State, rec.Attempts, rec.Status = state, prior+sent, status
		t.update(ctx, rec)
		if state == StateUnknown {
			t.logUnknown(ctx, rec)
		}
		// Updates may be lazy, and losing one usually costs one harmless
		// resend. Not for an action named by its fingerprint: lost "done",
		// a deliberate repeat after a crash would reuse the old key and be
		// answered with the first payment's replay. So it is synced.
		if state == StateDone && a.byFingerprint {
			if s, ok := t.journal.(interface{ Sync(context.Context) error }); ok {
				// The caller's context bounds the wait: the response is in
				// hand, and a lazy flush follows anyway.
				if err := s.Sync(ctx); err != nil && t.cfg.logger != nil {
					t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: journal sync of a done action failed",
						slog.String("action", rec.ActionID), slog.String("key", rec.Key), slog.Any("error", err))
				}
			}
		}
	}

	var lastStatus int // of the previous attempt, 0 if none or a transport error
	var lastErr error
	for n := 0; ; n++ {
		// The window may have ended during the wait (a device asleep, a
		// slow clock): never send a key the server may have forgotten.
		if a != nil && n > 0 && t.windowEndsFor(a, 0) {
			finish(StateUnknown, 0)
			return nil, fail(lastStatus, ErrKeyWindowExpired, lastErr)
		}
		out, err := t.newAttempt(req, b, key)
		if err != nil {
			finish(StatePending, 0)
			return nil, fail(0, nil, err)
		}
		resp, err := t.base.RoundTrip(out)
		sent++
		if err == nil && resp == nil {
			err = errors.New("idemretry: base RoundTripper returned neither response nor error")
		}
		if err != nil && resp != nil { // a broken base: keep the error, free the response
			discard(resp, 0)
			resp = nil
		}
		maybe = maybe || mayHaveReachedServer(err)
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}

		if !t.cfg.policy(ctx, resp, err) {
			if err != nil {
				finish(StatePending, 0)
				return nil, fail(0, nil, err)
			}
			if ctx.Err() != nil {
				// The policy stopped because the caller did, not because the
				// answer is definitive: a 503 here may hide a charge.
				finish(StatePending, 0)
			} else {
				finish(StateDone, status)
			}
			return resp, nil
		}

		// Retryable. stop ends the retries with what this attempt gave.
		stop := func(reason error) (*http.Response, error) {
			finish(StatePending, 0)
			if resp != nil {
				return resp, nil
			}
			return nil, fail(0, reason, err)
		}
		if n >= maxRetries {
			return stop(ErrAttemptsExhausted)
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop {
			return stop(ErrAttemptsExhausted)
		}
		if ra, ok := RetryAfter(resp, t.cfg.clock.Now()); ok {
			if ra > t.cfg.maxRetryAfter {
				return stop(ErrAttemptsExhausted) // resp is non-nil here
			}
			wait = max(wait, ra)
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return stop(ErrWaitExceedsDeadline)
		}
		if a != nil && t.windowEndsFor(a, wait) {
			discard(resp, t.cfg.maxDrain)
			finish(StateUnknown, 0)
			return nil, fail(status, ErrKeyWindowExpired, err)
		}
		ev := RetryEvent{Action: actionID, Key: key, Attempt: prior + sent, Wait: wait, Status: status, Err: err}
		if t.cfg.onRetry != nil {
			t.cfg.onRetry(ev)
		}
		if t.cfg.logger != nil {
			t.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "idemretry: retrying", slog.String("action", ev.Action),
				slog.String("key", ev.Key), slog.Int("attempt", ev.Attempt), slog.Duration("wait", ev.Wait),
				slog.Int("status", ev.Status), slog.Any("error", ev.Err))
		}
		discard(resp, t.cfg.maxDrain)
		if n == 0 {
			finish(StatePending, 0) // a crash during the waits keeps the attempt count
		}
		if err := t.sleep(ctx, wait); err != nil {
			finish(StatePending, 0)
			return nil, fail(status, nil, err)
		}
		lastStatus, lastErr = status, err
	}
}

// newAttempt clones req for one attempt, with a fresh body and the key.
func (t *Transport) newAttempt(req *http.Request, b *body, key string) (*http.Request, error) {
	r, err := b.next()
	if err != nil {
		return nil, fmt.Errorf("rewind request body: %w", err)
	}
	// A shallow copy (what Request.WithContext makes) with its own header:
	// the base RoundTripper must not modify the request, so only the header,
	// which gets the key, needs copying.
	out := req.WithContext(req.Context())
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = make(http.Header, 1)
	}
	out.Body, out.GetBody = r, b.getBody
	if key != "" {
		out.Header.Set(t.cfg.header, formatKey(key, t.cfg.quoted))
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

// discard drains a response body up to limit bytes, so that its connection
// can be reused, and closes it.
func discard(resp *http.Response, limit int64) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, limit)
	resp.Body.Close()
}

// mayHaveReachedServer is false only for errors raised before a connection
// existed: failing to resolve or to connect. Anything later may have
// delivered the request.
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
