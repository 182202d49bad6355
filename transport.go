package idemretry

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry/internal/actionlock"
)

// Transport is an http.RoundTripper that retries requests safely. Each
// request with a keyed method (POST and PATCH by default) belongs to a
// logical action and carries that action's Idempotency-Key on every attempt;
// the key is durable in the Journal before the first attempt leaves the
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
// concurrent use; attempts of one action from several goroutines take turns,
// so a double-click never races two requests under one key.
type Transport struct {
	base        http.RoundTripper
	cfg         config
	journal     Journal
	ownsJournal bool
	locks       actionlock.Set
}

// NewTransport returns a Transport that sends through base (if nil, its own
// clone of http.DefaultTransport, so that Close affects no one else). Unless
// WithJournal gives one, it opens the
// file journal in WithJournalDir's directory or DefaultJournalDir, owns it and
// closes it in Close; opening fails with an error wrapping ErrJournalLocked
// if another Transport or process holds that journal.
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
	t := &Transport{base: base, cfg: cfg, journal: cfg.journal}
	if t.journal == nil {
		dir := cfg.journalDir
		if dir == "" {
			var err error
			if dir, err = DefaultJournalDir(); err != nil {
				return nil, err
			}
		}
		// Done records must outlive the key window, whatever its length, or
		// a repeat within the window would get a new key; and expiry must
		// read the same clock as the window. The caller's options come
		// after, and win.
		opts := append([]JournalOption{
			WithJournalRetention(addSaturating(cfg.keyWindow, DefaultJournalGrace)),
			WithJournalClock(cfg.clock.Now),
		}, cfg.journalOpts...)
		j, err := OpenJournal(dir, opts...)
		if err != nil {
			return nil, err
		}
		t.journal, t.ownsJournal = j, true
		t.logRecovery(j)
	}
	return t, nil
}

func (c *config) validate() error {
	switch {
	case c.newBackOff == nil:
		return fmt.Errorf("%w: nil backoff constructor", ErrInvalidOption)
	case c.keyWindow <= 0:
		return fmt.Errorf("%w: key window %v, want > 0", ErrInvalidOption, c.keyWindow)
	case c.maxRetryAfter < 0:
		return fmt.Errorf("%w: max Retry-After %v, want >= 0", ErrInvalidOption, c.maxRetryAfter)
	case !isToken(c.header):
		return fmt.Errorf("%w: key header name %q is not an HTTP token", ErrInvalidOption, c.header)
	case c.journal != nil && c.journalDir != "":
		return fmt.Errorf("%w: both WithJournal and WithJournalDir", ErrInvalidOption)
	case c.maxBuffered < 0:
		return fmt.Errorf("%w: body buffer limit %d, want >= 0", ErrInvalidOption, c.maxBuffered)
	}
	return nil
}

// addSaturating returns a+b for non-negative durations, capped at the
// longest Duration.
func addSaturating(a, b time.Duration) time.Duration {
	if a > maxDuration-b {
		return maxDuration
	}
	return a + b
}

// isToken reports whether s is a non-empty HTTP token (RFC 9110, 5.6.2),
// as a header name must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// Journal returns the journal the Transport keeps keys in, for
// reconciliation at start-up (Journal.Unfinished, Journal.Forget).
func (t *Transport) Journal() Journal { return t.journal }

// Close closes the journal if the Transport opened it, and the base
// transport's idle connections. Requests in flight may fail afterwards.
func (t *Transport) Close() error {
	t.CloseIdleConnections()
	if t.ownsJournal {
		return t.journal.Close()
	}
	return nil
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
// its cap, a deadline the next wait would miss), the last response with its
// body unread. Errors: before sending, ErrInvalidRequest, ErrInvalidKey,
// ErrInvalidAction, ErrBodyTooLarge or a journal error; for an action, an *ActionError that
// names it, its key and its attempts, and unwraps to the reason
// (ErrKeyWindowExpired, ErrFingerprintMismatch, ErrAttemptsExhausted,
// ErrWaitExceedsDeadline) and the last cause.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil || req.URL == nil || req.URL.Host == "" {
		if req != nil && req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("%w: nil request, URL or host", ErrInvalidRequest)
	}
	b, err := newBody(req, t.cfg.maxBuffered)
	if err != nil {
		return nil, err
	}
	defer b.close()

	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !t.cfg.keyed[method] {
		// Without a key, only a method that is idempotent by definition may
		// be sent twice; any other is sent once.
		return t.attempts(req, b, nil, idempotentMethods[method])
	}
	a, err := t.reserve(req, b)
	if err != nil {
		return nil, err
	}
	defer a.unlock()
	return t.attempts(req, b, a, true)
}

// idempotentMethods may be retried without a key (RFC 9110, 9.2.2).
var idempotentMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true,
	http.MethodPut: true, http.MethodDelete: true,
}

// action is a reserved action during one RoundTrip.
type action struct {
	rec Record // as the journal holds it
	// resumed: the record existed before this RoundTrip, so an earlier one,
	// perhaps in a process that died, may have sent it.
	resumed bool
	// byFingerprint: the action is named by its request's fingerprint, so
	// its "done" must be durable before RoundTrip returns (see finish).
	byFingerprint bool
	unlock        func()
}

// reserve resolves req's action, takes its in-process turn and reserves its
// key durably. It sends nothing.
func (t *Transport) reserve(req *http.Request, b *body) (*action, error) {
	ctx := req.Context()
	r, err := b.reader()
	if err != nil {
		return nil, fmt.Errorf("idemretry: request body: %w", err)
	}
	fp, err := fingerprint(req, r)
	if r != nil {
		r.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("idemretry: request body: %w", err)
	}

	var callerKey string
	if vs := req.Header.Values(t.cfg.header); len(vs) > 1 {
		return nil, fmt.Errorf("%w: %d %s headers", ErrInvalidKey, len(vs), t.cfg.header)
	} else if len(vs) == 1 {
		if callerKey, err = parseKey(vs[0]); err != nil {
			return nil, err
		}
	}
	id, err := t.actionID(req, callerKey, fp)
	if err != nil {
		return nil, err
	}
	mode := ReuseAny
	if strings.HasPrefix(id, fingerprintActionPrefix) {
		mode = ReusePending
	}
	key := callerKey
	if key == "" {
		if key, err = t.cfg.newKey(); err != nil {
			return nil, fmt.Errorf("idemretry: new key: %w", err)
		}
	}

	unlock, err := t.locks.Lock(ctx, id)
	if err != nil {
		return nil, err
	}
	now := t.now()
	rec, created, err := t.journal.Reserve(ctx, Record{
		ActionID: id, Key: key, Fingerprint: fp, CreatedAt: now, State: StatePending,
	}, mode)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("idemretry: reserve key for action %q: %w", id, err)
	}
	fail := func(reason error) (*action, error) {
		unlock()
		return nil, &ActionError{Action: id, Key: rec.Key, Attempts: rec.Attempts, Status: rec.Status,
			MaybeProcessed: !created || rec.Attempts > 0, Reason: reason}
	}
	switch {
	case rec.Fingerprint != fp:
		return fail(ErrFingerprintMismatch)
	case rec.State == StateUnknown:
		return fail(ErrKeyWindowExpired)
	case t.windowEnds(rec, now, 0):
		if rec.State == StatePending {
			rec.State = StateUnknown
			t.update(ctx, rec)
			t.logUnknown(ctx, rec)
		}
		return fail(ErrKeyWindowExpired)
	}
	return &action{rec: rec, resumed: !created, byFingerprint: mode == ReusePending, unlock: unlock}, nil
}

// actionID names req's action: a key the caller set names it (the server
// knows the action by its key, so one key must mean one payload); else the
// id given with WithAction; else the request's fingerprint. A hop of
// http.Client's 307/308 redirect is a sub-action of its own, with its own
// key: the first server did not perform the action, the next one might.
func (t *Transport) actionID(req *http.Request, callerKey string, fp Fingerprint) (string, error) {
	id, explicit := req.Context().Value(actionKey{}).(string)
	switch {
	case callerKey != "":
		id = keyActionPrefix + callerKey
	case explicit:
		if err := checkActionID(id); err != nil {
			return "", err
		}
	default:
		return fingerprintActionID(fp), nil
	}
	if req.Response != nil {
		id += redirectActionInfix + hex.EncodeToString(fp[:8])
	}
	return id, nil
}

// now is the Transport's time for key windows: the clock's, unless the
// journal has seen a later time (a wall clock set back must not make an
// old key look young again).
func (t *Transport) now() time.Time {
	now := t.cfg.clock.Now()
	if m, ok := t.journal.(interface{ Now() time.Time }); ok {
		if jn := m.Now(); jn.After(now) {
			return jn
		}
	}
	return now
}

// windowEnds reports whether the key window of rec is over at now+d.
func (t *Transport) windowEnds(rec Record, now time.Time, d time.Duration) bool {
	return !now.Add(d).Before(rec.CreatedAt.Add(t.cfg.keyWindow))
}

// update records rec's progress. A failed update is not reported to the
// caller: the response in hand is still right, and a journal that lost the
// update only causes one more attempt with the same key. A journal that
// failed (for instance on fsync) refuses the next Reserve, and that is
// reported.
func (t *Transport) update(ctx context.Context, rec Record) {
	_ = t.journal.Update(context.WithoutCancel(ctx), rec)
}

// logRecovery reports at Warn what opening the journal found damaged: a
// torn tail (a crash mid-write; a damaged last frame looks the same) or
// ranges a salvage skipped.
func (t *Transport) logRecovery(j *FileJournal) {
	r := j.Recovery()
	if t.cfg.logger == nil || (!r.TornTail && len(r.Salvaged) == 0) {
		return
	}
	t.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, "idemretry: journal recovered from damage",
		slog.String("dir", j.Dir()), slog.Bool("torn_tail", r.TornTail), slog.Int64("torn_offset", r.TornOffset),
		slog.Int64("torn_bytes", r.TornBytes), slog.String("torn_copy", r.TornCopy),
		slog.Int("salvaged_ranges", len(r.Salvaged)), slog.String("corrupt_copy", r.CorruptCopy))
}

// logUnknown says that an action's outcome must now be reconciled by hand.
func (t *Transport) logUnknown(ctx context.Context, rec Record) {
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: key window ended, outcome unknown: reconcile the action",
			slog.String("action", rec.ActionID), slog.String("key", rec.Key), slog.Time("created", rec.CreatedAt))
	}
}

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
			MaybeProcessed: maybe || (a != nil && (a.resumed || prior > 0)), Reason: reason, Err: cause}
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
				_ = s.Sync(context.WithoutCancel(ctx))
			}
		}
	}

	var lastStatus int // of the previous attempt, 0 if none or a transport error
	var lastErr error
	for n := 0; ; n++ {
		// The window may have ended during the wait (a device asleep, a
		// slow clock): never send a key the server may have forgotten.
		if a != nil && n > 0 && t.windowEnds(a.rec, t.now(), 0) {
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
		now := t.now()
		if ra, ok := RetryAfter(resp, now); ok {
			if ra > t.cfg.maxRetryAfter {
				return stop(ErrAttemptsExhausted) // resp is non-nil here
			}
			wait = max(wait, ra)
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return stop(ErrWaitExceedsDeadline)
		}
		if a != nil && t.windowEnds(a.rec, now, wait) {
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

var _ http.RoundTripper = (*Transport)(nil)
