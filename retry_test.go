package idemretry_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// 503, 503, 201: three attempts, one key, and the journal says done.
func TestRetriesUntilSuccessWithOneKey(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503), status(503))
	tr, j, _ := newTestTransport(t)

	ctx := idemretry.WithAction(context.Background(), "pay:order-1")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":100}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))

	reqs := srv.requireOnePayment(t, 3)
	require.NoError(t, uuidCheck(reqs[0].Key))

	unfinished, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, unfinished, "a 201 is final: the action is done")
}

// The server charges, then the connection drops before the answer: the
// retry carries the same key and gets the stored answer; one charge in all.
func TestCommitThenDropIsChargedOnce(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	tr, _, _ := newTestTransport(t)

	ctx := idemretry.WithAction(context.Background(), "pay:order-2")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":250}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.True(t, idemretry.IsReplay(resp), "the second answer is the stored one")
	readAll(t, resp)

	reqs := srv.seen()
	require.GreaterOrEqual(t, len(reqs), 2)
	for _, r := range reqs {
		assert.Equal(t, reqs[0].Key, r.Key)
	}
	assert.Equal(t, 1, srv.chargeCount())
}

func TestStatusClassification(t *testing.T) {
	cases := []struct {
		status   int
		attempts int // with two retries allowed
	}{
		{400, 1}, {401, 1}, {403, 1}, {404, 1}, {422, 1}, {501, 1}, {505, 1},
		{409, 3}, {429, 3}, {500, 3}, {502, 3}, {503, 3}, {504, 3},
	}
	for _, c := range cases {
		t.Run(strconv.Itoa(c.status), func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				status(c.status)(w)
				return true
			}
			tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(2))
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
			require.NoError(t, err)
			assert.Equal(t, c.status, resp.StatusCode)
			assert.Equal(t, http.StatusText(c.status), readAll(t, resp), "the last response comes back readable")
			assert.Len(t, srv.seen(), c.attempts)
		})
	}
}

func TestServerHintsOverrideStatus(t *testing.T) {
	cases := []struct {
		name     string
		answer   func(http.ResponseWriter)
		attempts int
	}{
		{"Stripe-Should-Retry false on 503", status(503, "Stripe-Should-Retry", "false"), 1},
		{"Stripe-Should-Retry true on 400", status(400, "Stripe-Should-Retry", "true"), 3},
		{"replayed 500 is final", status(500, "Idempotent-Replayed", "true"), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { c.answer(w); return true }
			tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(2))
			roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
			assert.Len(t, srv.seen(), c.attempts)
		})
	}
}

// Retry-After is honoured when longer than the jittered wait, in seconds and
// as an HTTP-date.
func TestRetryAfter(t *testing.T) {
	clk := newFakeClock()
	date := clk.Now().Add(7 * time.Second).UTC().Format(http.TimeFormat)
	srv := newPayServer(t)
	srv.script = scriptFirst(status(429, "Retry-After", "3"), status(503, "Retry-After", date))
	tr, _, clk := newTestTransport(t, idemretry.WithBackOff(constant(time.Second)))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	// Retry-After is a floor with the drawn wait on top: 3 s + the constant
	// backoff's 1 s; the date is 7 s after the start and the clock is then
	// 4 s on, so 3 s + 1 s again.
	assert.Equal(t, []time.Duration{4 * time.Second, 4 * time.Second}, clk.Waits())
}

// A Retry-After beyond the cap ends the retries at once: the caller gets the
// response instead of a RoundTrip that sleeps for an hour.
func TestRetryAfterBeyondCapReturnsAtOnce(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503, "Retry-After", "3600"))
	tr, _, clk := newTestTransport(t, idemretry.WithMaxRetryAfter(time.Minute))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, "3600", resp.Header.Get("Retry-After"))
	readAll(t, resp)
	assert.Len(t, srv.seen(), 1)
	assert.Empty(t, clk.Waits())
}

// A cancelled context during a wait returns promptly and leaves nothing
// running (newTestTransport's cleanup checks goroutines).
func TestCancelDuringWaitReturnsPromptly(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	j := journal.NewMemory()
	base := &http.Transport{}
	ctx, cancel := context.WithCancel(idemretry.WithAction(context.Background(), "pay:cancel"))
	defer cancel()
	var cancelledAt atomic.Int64
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithBackOff(constant(time.Hour)),
		idemretry.WithObserver(func(ev idemretry.Event) {
			if ev.Kind != idemretry.EventRetry {
				return
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				cancelledAt.Store(time.Now().UnixNano())
				cancel()
			}()
		}))
	require.NoError(t, err)
	t.Cleanup(func() { base.CloseIdleConnections(); checkNoPackageGoroutines(t) })
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	returned := time.Now()
	require.Nil(t, resp)
	require.ErrorIs(t, err, context.Canceled)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "pay:cancel", ae.Action)
	assert.Equal(t, 1, ae.Attempts)
	assert.Less(t, returned.Sub(time.Unix(0, cancelledAt.Load())), 50*time.Millisecond)

	// The action stays pending with its key, for a later resend.
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, un, 1)
	assert.Equal(t, srv.seen()[0].Key, un[0].Key)
}

// I5: a wait that would end after the context's deadline is not started.
func TestNoWaitPastDeadline(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, _, clk := newTestTransport(t, idemretry.WithBackOff(constant(time.Minute)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err, "a response is in hand: it is returned")
	assert.Equal(t, 503, resp.StatusCode)
	readAll(t, resp)
	assert.Len(t, srv.seen(), 1)
	assert.Empty(t, clk.Waits())
	assert.Less(t, time.Since(start), 5*time.Second)
}

// I5 with a network error: the typed error says why it stopped.
func TestNoWaitPastDeadlineNetworkError(t *testing.T) {
	addr := closedAddr(t)
	tr, _, clk := newTestTransport(t, idemretry.WithBackOff(constant(time.Minute)))
	ctx, cancel := context.WithTimeout(idemretry.WithAction(context.Background(), "pay:dl"), 30*time.Second)
	defer cancel()
	_, err := tr.RoundTrip(post(t, ctx, "http://"+addr, "x"))
	require.ErrorIs(t, err, idemretry.ErrWaitExceedsDeadline)
	assert.Empty(t, clk.Waits())
}

// Connection refused is retried; after the last attempt the error names the
// action, the key and the attempts, says nothing can have been processed,
// and unwraps to the network error.
func TestNetworkErrorsRetriedThenTypedError(t *testing.T) {
	addr := closedAddr(t)
	tr, j, clk := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:refused")
	_, err := tr.RoundTrip(post(t, ctx, "http://"+addr, "x"))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "pay:refused", ae.Action)
	assert.Equal(t, idemretry.DefaultMaxRetries+1, ae.Attempts)
	assert.False(t, ae.MaybeProcessed, "refused connections never reached a server")
	assert.ErrorIs(t, err, idemretry.ErrAttemptsExhausted)
	var opErr *net.OpError
	assert.ErrorAs(t, err, &opErr)
	assert.Contains(t, err.Error(), ae.Key)
	assert.Len(t, clk.Waits(), idemretry.DefaultMaxRetries)

	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, un, 1)
	assert.Equal(t, ae.Key, un[0].Key)
	assert.Equal(t, journal.StatePending, un[0].State)
	assert.Equal(t, idemretry.DefaultMaxRetries+1, un[0].Attempts)
}

// The full-jitter default draws every wait within its ceiling.
func TestDefaultWaitsAreFullJitter(t *testing.T) {
	addr := closedAddr(t)
	tr, _, clk := newTestTransport(t)
	_, err := tr.RoundTrip(post(t, context.Background(), "http://"+addr, "x"))
	require.Error(t, err)
	waits := clk.Waits()
	require.Len(t, waits, 5)
	ceil := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for i, w := range waits {
		assert.GreaterOrEqual(t, w, time.Duration(0))
		assert.Less(t, w, ceil[i], "wait %d", i)
	}
}

// A connection cut before any answer (nothing committed) is retried.
func TestDroppedConnectionRetried(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			hijackAndClose(w)
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, 201, resp.StatusCode)
	readAll(t, resp)
	assert.Equal(t, 1, srv.chargeCount())
}

// Errors a resend repeats are not retried: a certificate nobody trusts.
func TestCertificateErrorNotRetried(t *testing.T) {
	var handshakes atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ErrorLog = discardLogger()
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		handshakes.Add(1)
		return nil, nil
	}}
	srv.StartTLS()
	defer srv.Close()
	tr, _, clk := newTestTransport(t)
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.Error(t, err)
	var verr *tls.CertificateVerificationError
	assert.ErrorAs(t, err, &verr)
	assert.EqualValues(t, 1, handshakes.Load())
	assert.Empty(t, clk.Waits())
}

// The caller's cancellation before sending is not retried either.
func TestCallerCancellationNotRetried(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, srv.seen())
}

// A BackOff that says Stop ends the retries.
func TestBackOffStop(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(500)(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithBackOff(func() backoff.BackOff {
		return backoff.WithMaxRetries(backoff.NewConstantBackOff(time.Millisecond), 1)
	}))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.Len(t, srv.seen(), 2)
}

// GET carries no key and is retried under the same policy.
func TestIdempotentMethodsRetriedWithoutKey(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(502))
	tr, j, _ := newTestTransport(t)
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	roundTrip(t, tr, req)
	reqs := srv.seen()
	require.Len(t, reqs, 2)
	assert.Equal(t, []string{"", ""}, keysOf(reqs))
	un, _ := j.Unfinished(context.Background())
	assert.Empty(t, un)
}

func TestOnRetryHook(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503), status(429))
	var events []idemretry.Event
	tr, _, _ := newTestTransport(t, idemretry.WithObserver(func(e idemretry.Event) {
		if e.Kind == idemretry.EventRetry {
			events = append(events, e)
		}
	}))
	ctx := idemretry.WithAction(context.Background(), "pay:hook")
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
	require.Len(t, events, 2)
	assert.Equal(t, 503, events[0].Status)
	assert.Equal(t, 429, events[1].Status)
	assert.Equal(t, []int{1, 2}, []int{events[0].Attempt, events[1].Attempt})
	assert.Equal(t, srv.seen()[0].Key, events[0].Key)
	assert.Equal(t, "pay:hook", events[1].Action)
}

// WithLogger logs retries at Debug and an outcome-unknown action at Warn.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithLogger(logger), idemretry.WithKeyWindow(time.Minute),
		idemretry.WithBackOff(constant(40*time.Second)))
	_, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:log"), srv.URL, "secret-body"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	out := buf.String()
	assert.Contains(t, out, "level=DEBUG msg=\"idemretry: retrying\" action=pay:log")
	assert.Contains(t, out, "level=WARN")
	assert.NotContains(t, out, "secret-body")
}

func TestRetryAfterParsing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		status int
		value  string
		want   time.Duration
		ok     bool
	}{
		{429, "5", 5 * time.Second, true},
		{503, " 0 ", 0, true},
		{503, now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{503, now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{429, "99999999999999999999", 1<<63 - 1, true},
		{429, "9223372036854775807", 1<<63 - 1, true},
		{429, "-3", 0, false},
		{429, "+30", 0, false},
		{429, "3.5", 0, false},
		{429, "soon", 0, false},
		{429, "", 0, false},
		{409, "5", 5 * time.Second, true}, // every error status: the Transport reads it on each answer it retries
		{500, "5", 5 * time.Second, true},
		{502, now.Add(time.Minute).Format(http.TimeFormat), time.Minute, true},
		{200, "5", 0, false},
		{307, "5", 0, false}, // on a redirect it is the wait before following it, not a retry's
	}
	for _, c := range cases {
		resp := &http.Response{StatusCode: c.status, Header: http.Header{"Retry-After": {c.value}}}
		got, ok := idemretry.RetryAfter(resp, now)
		assert.Equal(t, c.ok, ok, "%d %q", c.status, c.value)
		assert.Equal(t, c.want, got, "%d %q", c.status, c.value)
	}
	_, ok := idemretry.RetryAfter(nil, now)
	assert.False(t, ok)
}

// retryingBase is a base transport that retries by itself, as a client
// wrapped twice would: up to tries requests per call, then it gives up,
// returning the last response with its error when keep is set (as
// go-retryablehttp's pass-through error handler does) or the error alone.
type retryingBase struct {
	inner http.RoundTripper
	tries int
	keep  bool
}

func (b *retryingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	var resp *http.Response
	for i := 0; i < b.tries; i++ {
		if i > 0 {
			resp.Body.Close()
			body, _ := r.GetBody()
			r = r.Clone(r.Context())
			r.Body = body
		}
		var err error
		if resp, err = b.inner.RoundTrip(r); err != nil {
			return nil, err
		}
		if resp.StatusCode < 500 {
			return resp, nil
		}
	}
	if b.keep {
		return resp, errors.New("base: giving up")
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, errors.New("base: giving up")
}

// Retries stacked on a base that retries by itself: every request written
// is counted, and the last status is kept when the base returns it.
func TestStackedRetriesCountedAndStatusKept(t *testing.T) {
	t.Parallel()
	var requests atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	inner := &http.Transport{}
	defer inner.CloseIdleConnections()
	for _, keep := range []bool{false, true} {
		requests.Store(0)
		tr, err := idemretry.NewTransport(&retryingBase{inner: inner, tries: 5, keep: keep},
			inMemory(), idemretry.WithMaxRetries(1), idemretry.WithRetryBudget(0, 0),
			idemretry.WithBackOff(constant(0)))
		require.NoError(t, err)
		_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:stacked"), srv.URL, "x"))
		var ae *idemretry.ActionError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, int32(10), requests.Load())
		assert.Equal(t, 10, ae.Attempts, "attempts report what reached the wire (keep=%v)", keep)
		if keep {
			assert.Equal(t, 503, ae.Status, "the base's last status is kept")
		}
		require.NoError(t, tr.Close())
	}
}

// A BackOff factory that returns nil is the caller's bug: RoundTrip refuses
// the request with ErrInvalidOption before sending it, for WithBackOff and for
// RequestBackOff alike, and does not panic.
func TestNilBackOffIsRefusedBeforeSending(t *testing.T) {
	nilBackOff := func() backoff.BackOff { return nil }
	for name, tc := range map[string]struct {
		opts []idemretry.Option
		ctx  func(context.Context) context.Context
	}{
		"WithBackOff": {opts: []idemretry.Option{idemretry.WithBackOff(nilBackOff)}, ctx: func(c context.Context) context.Context { return c }},
		"RequestBackOff": {ctx: func(c context.Context) context.Context {
			return idemretry.WithRequestOptions(c, idemretry.RequestBackOff(nilBackOff))
		}},
	} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, _, _ := newTestTransport(t, tc.opts...)
			ctx := tc.ctx(idemretry.WithAction(context.Background(), "pay:nil-backoff"))
			err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":1}`))
			require.ErrorIs(t, err, idemretry.ErrInvalidOption)
			require.Equal(t, 1, strings.Count(err.Error(), "idemretry:"), "the prefix once: %v", err)
			require.Empty(t, srv.pay.Requests(), "a request was sent with no BackOff to retry it")
		})
	}
}

// Retry-After is a floor on every answer that is retried, not only on 429
// and 503: NestJS's idempotency interceptor answers a request whose key is
// still being processed with 409 and Retry-After: 1, a gateway may send it
// with a 502, and a hint may retry a 400 that carries it. The drawn wait
// (here the constant 1 s) comes on top, and the cap still applies.
func TestRetryAfterOnEveryRetriedStatus(t *testing.T) {
	nest409 := answer(409, `{"statusCode":409,"message":"A request is outstanding for this Idempotency-Key"}`,
		"Content-Type", "application/json; charset=utf-8", "Retry-After", "1")
	cases := []struct {
		name string
		a    func(http.ResponseWriter)
	}{
		{"NestJS 409 in flight", nest409},
		{"409", status(409, "Retry-After", "1")},
		{"500", status(500, "Retry-After", "1")},
		{"502", status(502, "Retry-After", "1")},
		{"504", status(504, "Retry-After", "1")},
		{"400 a hint retries", status(400, "Retry-After", "1", "Stripe-Should-Retry", "true")},
		{"429", status(429, "Retry-After", "1")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(c.a, c.a)
			tr, _, clk := newTestTransport(t, idemretry.WithBackOff(constant(time.Second)))
			resp := roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:ra"), srv.URL, "x"))
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			srv.requireOnePayment(t, 3)
			assert.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second}, clk.Waits(), "Retry-After 1 s + the drawn 1 s, each time")
		})
	}
}

// A Retry-After beyond the cap ends the retries at once on a 409 too: the
// caller gets the answer, and the action stays pending under its key.
func TestRetryAfterBeyondCapOnConflict(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(409, "Retry-After", "3600"))
	tr, j, clk := newTestTransport(t, idemretry.WithMaxRetryAfter(time.Minute))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:ra-cap"), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, 409, resp.StatusCode)
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrRetryAfterTooLong)
	readAll(t, resp)
	assert.Len(t, srv.seen(), 1)
	assert.Empty(t, clk.Waits())
	left, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, left, 1, "the action is pending, its key kept")
	assert.Equal(t, srv.seen()[0].Key, left[0].Key)
}

// A BackOff factory that returns nil makes RoundTrip fail with
// ErrInvalidOption "before anything is sent". It must also leave nothing
// behind: a pending record would make a later Resume (or a resend) send a
// payment the app was told had failed.
func TestNilBackOffLeavesNoPendingAction(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	for _, tc := range []struct {
		name string
		opts []idemretry.Option
		ctx  func(context.Context) context.Context
	}{
		{"WithBackOff", []idemretry.Option{idemretry.WithBackOff(func() backoff.BackOff { return nil })}, func(c context.Context) context.Context { return c }},
		{"RequestBackOff", nil, func(c context.Context) context.Context {
			return idemretry.WithRequestOptions(c, idemretry.RequestBackOff(func() backoff.BackOff { return nil }))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := journal.NewMemory()
			tr := transportOver(t, j, tc.opts...)
			for _, ctx := range []context.Context{idemretry.WithAction(context.Background(), "pay:"+tc.name), context.Background()} {
				_, err := tr.RoundTrip(post(t, tc.ctx(ctx), srv.URL, `{"order":"`+tc.name+`"}`))
				require.ErrorIs(t, err, idemretry.ErrInvalidOption)
			}
			left, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, left, "a request refused before anything was sent left a pending action, which Resume would send")
			assert.Empty(t, srv.seen())
			resp, err := tr.RoundTrip(mustGet(t, tc.ctx(context.Background()), srv.URL))
			if err == nil {
				resp.Body.Close()
			}
			assert.ErrorIs(t, err, idemretry.ErrInvalidOption, "a GET with the same BackOff")
		})
	}
}

func mustGet(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}
