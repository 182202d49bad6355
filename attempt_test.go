package idemretry_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Attempts (attempt.go): the answers an attempt discards or peeks at, cut
// in time and bytes; the caller's request and header copied for each
// attempt; its writes counted; the waits between attempts held to the
// caller's deadline; what a policy that reads bodies sees.

// A policy of the caller's that takes longer than DefaultMaxDrainTime to
// call a 201 final (it reads no body: it logs, asks a slow service...)
// must not cut the body of the answer it lets through.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxSlowPolicyDoesNotCutTheFinalBody).
func TestSlowPolicyDoesNotCutTheFinalBody(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("x", size))
	}))
	defer srv.Close()
	slow := func(ctx context.Context, resp *http.Response, err error) bool {
		time.Sleep(2 * idemretry.DefaultMaxDrainTime)
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(slow))
	deadline, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Named and unnamed (the default path: no WithAction), with and
	// without a caller's deadline.
	for i, ctx := range []context.Context{
		idemretry.WithAction(context.Background(), "pay:slow-policy"),
		context.Background(),
		deadline,
	} {
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, fmt.Sprintf(`{"amount":%d}`, i+1)))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "request %d: read %d of %d bytes of the 201", i, len(b), size)
		require.Len(t, b, size, "request %d", i)
	}
}

// An attempt through an *http.Transport has no cancel of its own: a
// discarded body (a 503's) or an error body the policy peeks at (a 409's)
// that stalls is cut by closing it. Each way a net/http body can be read
// (HTTP/1, HTTP/1 decompressed by the Transport, HTTP/2), and a base that
// is not an *http.Transport (which keeps its per-attempt cancel), must cut
// the stalled read after DefaultMaxDrainTime: the server sees the stalled
// request end long before it would release it, and the retry is answered.
//
// Each runs under a caller context with a deadline and under one that can
// never end (no deadline, as most apps send): the attempt's own cancel
// must cut in both.
func TestStalledBodyIsCutOnEveryBase(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusConflict} {
		for _, kind := range []string{"http1", "http1-gzip", "http2", "wrapped"} {
			for _, deadline := range []bool{true, false} {
				name := http.StatusText(status) + "/" + kind + "/no-deadline"
				if deadline {
					name = http.StatusText(status) + "/" + kind + "/deadline"
				}
				t.Run(name, func(t *testing.T) {
					testStalledBodyIsCut(t, status, kind, deadline)
				})
			}
		}
	}
}

func testStalledBodyIsCut(t *testing.T, status int, kind string, deadline bool) {
	release := make(chan struct{})
	cut := make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(firstThenCreated(&n, `{"charge":"ch_1"}`, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var body io.Writer = w
		var zw *gzip.Writer
		if kind == "http1-gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
			body = zw
		} else {
			w.Header().Set("Content-Length", "100000")
		}
		w.WriteHeader(status)
		io.WriteString(body, `{"error":{"code":"idempotency_key_in_use"`+strings.Repeat(" ", 100))
		if zw != nil {
			zw.Flush()
		}
		w.(http.Flusher).Flush()
		select { // the body stalls
		case <-release:
		case <-r.Context().Done():
			close(cut)
		case <-time.After(15 * time.Second): // not cut: RoundTrip returns, and the test fails
		}
	}))
	var base http.RoundTripper
	switch kind {
	case "http2":
		srv.EnableHTTP2 = true
		srv.StartTLS()
		base = srv.Client().Transport
		require.IsType(t, &http.Transport{}, base)
	case "wrapped":
		srv.Start()
		hb := &http.Transport{}
		defer hb.CloseIdleConnections()
		base = rtFunc(hb.RoundTrip)
	default:
		srv.Start()
		hb := &http.Transport{}
		defer hb.CloseIdleConnections()
		base = hb
	}
	defer srv.Close()
	defer close(release)

	tr, ctx := retryTwiceOver(t, base)
	if !deadline {
		ctx = context.Background()
	}
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:stalled-"+kind), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))
	select {
	case <-cut: // the stalled request was cut, not waited out
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled body was not cut")
	}
	require.EqualValues(t, 2, n.Load())
}

// Review of the hot-path pass (2d31af3): the BackOff made late, the
// flight's channel made lazily, the returned body's wrapper in the trace,
// the drain timer skipped for the default policy. Real loopback HTTP.

// A caller's BackOff is reset when its RoundTrip begins, as backoff.Retry
// resets one before the first try: an ExponentialBackOff's MaxElapsedTime
// bounds the whole RoundTrip, its first attempt included. A BackOff made
// (and reset) only at the first retry measures from there, and retries an
// action whose budget a slow first attempt had already spent.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewCustomBackOffMeasuresFromRoundTrip).
func TestCustomBackOffMeasuresFromRoundTrip(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if hits.Add(1) == 1 {
			time.Sleep(400 * time.Millisecond) // the first attempt spends the budget
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	newBO := func() backoff.BackOff {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.RandomizationFactor, b.MaxElapsedTime = 5*time.Millisecond, 0, 200*time.Millisecond
		return b
	}
	for _, how := range []string{"WithBackOff", "RequestBackOff"} {
		t.Run(how, func(t *testing.T) {
			hits.Store(0)
			var opts []idemretry.Option
			ctx := context.Background()
			if how == "WithBackOff" {
				opts = append(opts, idemretry.WithBackOff(newBO))
			} else {
				ctx = idemretry.WithRequestOptions(ctx, idemretry.RequestBackOff(newBO))
			}
			tr := transportOver(t, journal.NewMemory(), append(opts, idemretry.WithMaxRetries(5))...)
			resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
			if err == nil {
				readAll(t, resp)
			}
			require.Equal(t, int32(1), hits.Load(), "requests sent: the BackOff's MaxElapsedTime (200 ms) had passed when the first attempt (400 ms) answered")
		})
	}
}

// The body returned after retries is the last attempt's, its wrapper kept
// in that attempt's trace: it reads whole, closes twice, and the next
// actions (whose attempts make new traces) leave it alone.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewBodyAfterRetriesClosedTwice).
func TestBodyAfterRetriesClosedTwice(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(http.StatusServiceUnavailable), status(http.StatusBadGateway))
	tr, _, _ := transportWithConstant(t)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":3}`))
	require.NoError(t, err)
	first := resp.Body
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	for i := range 5 {
		r2, err := tr.RoundTrip(post(t, context.Background(), srv.URL, fmt.Sprintf(`{"amount":%d}`, 100+i)))
		require.NoError(t, err)
		readAll(t, r2)
	}
	b, err := io.ReadAll(first)
	require.NoError(t, err)
	require.Equal(t, `{"charge":"ch_1"}`, string(b))
	require.NoError(t, first.Close())
	require.NoError(t, first.Close())
}

// The default policy reads the start of a JSON 409 (KeyReuseRejected): a
// 409 whose body stalls after its headers is still cut after the drain
// time, attempt after attempt, so RoundTrip returns long before its
// caller's deadline. A stalled 503 is never read by the policy.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewStalledErrorBodiesDoNotHang).
func TestStalledErrorBodiesDoNotHang(t *testing.T) {
	for _, code := range []int{http.StatusConflict, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				io.WriteString(w, `{"error":`)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(release) })
			tr, _, _ := transportWithConstant(t)
			ctx, cancel := context.WithTimeout(idemretry.WithRequestOptions(context.Background(), idemretry.RequestMaxRetries(2)), 30*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":9}`))
			if err == nil {
				resp.Body.Close()
			}
			require.Less(t, time.Since(start), 15*time.Second, "RoundTrip waited on a stalled body: %v", err)
			require.NoError(t, ctx.Err())
		})
	}
}

// The attempt's header copy: the key header set by the caller under a
// non-canonical spelling must reach the wire once, as the one key of every
// attempt (not twice, under both spellings), beside many values of another
// header, and nothing the attempts do reaches the caller's header.
//
// Found in the second review of the hot-path pass (was TestReview2KeyHeaderSpellingsAndIsolation).
func TestAttemptKeyHeaderSpellingsAndIsolation(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n < 3 {
			status(http.StatusServiceUnavailable)(w)
			return true
		}
		return false
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)))
	req := post(t, context.Background(), srv.URL, `{"amount":1}`)
	// Many values: beyond what the attempt's own value array holds.
	for i := 0; i < 12; i++ {
		req.Header.Add("X-Many", strings.Repeat("v", i+1))
	}
	req.Header["idempotency-key"] = []string{"caller-key-review2"} // not canonical: net/http sends it as is
	hdr := req.Header.Clone()
	roundTrip(t, tr, req)
	require.Equal(t, hdr, req.Header, "the caller's header was changed")
	got := srv.seen()
	require.Len(t, got, 3)
	for i, r := range got {
		keys := r.Header.Values("Idempotency-Key")
		require.Len(t, keys, 1, "attempt %d: the key header sent %v", i, keys)
		require.Equal(t, "caller-key-review2", keys[0], "one key for every attempt")
		require.Equal(t, hdr["X-Many"], r.Header.Values("X-Many"))
	}
}

// An attempt through an *http.Transport runs in the caller's context: the
// caller's cancel during a stalled 503 body (a policy that reads every
// body) ends RoundTrip promptly with the caller's error, the stalled
// request is ended at the server, and the same Transport's next request
// gets its answer over a working connection.
//
// Found in the second review of the hot-path pass (was TestReview2CallerCancelDuringStalledBodyAndReuse).
func TestCallerCancelDuringStalledBodyAndReuse(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	var ended atomic.Int32
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/ok" {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "ok")
			return
		}
		n.Add(1)
		if stallBody(w, r, http.StatusServiceUnavailable, "partial", release) {
			ended.Add(1)
		}
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	slowPolicy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil {
			io.ReadAll(resp.Body) // stalls until cut
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()),
		idemretry.WithRetryPolicy(slowPolicy), idemretry.WithBackOff(constant(5*time.Second)), idemretry.WithMaxRetries(3))
	require.NoError(t, err)
	defer tr.Close()

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for n.Load() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:review2-cancel"), srv.URL+"/pay", `{"amount":1}`))
	if err == nil { // the last answer, given up on for the caller's cancel
		resp.Body.Close()
		err = idemretry.GiveUpReason(resp)
	}
	require.True(t, errors.Is(err, context.Canceled), "want the caller's cancel, got %v", err)
	require.Less(t, time.Since(start), 4*time.Second, "RoundTrip waited out the backoff or the stall")
	require.EqualValues(t, 1, n.Load(), "no attempt after the caller's cancel")
	require.Eventually(t, func() bool { return ended.Load() == 1 }, 10*time.Second, 10*time.Millisecond,
		"the stalled request's connection outlived RoundTrip")

	// The Transport's connections still work.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	resp = roundTrip(t, tr, post(t, idemretry.WithAction(ctx2, "pay:review2-after"), srv.URL+"/ok", `{}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}

// A final answer whose body the policy peeked at is returned whole, and
// stays readable after DefaultMaxDrainTime: the timer that would cut a
// stalled peek must not close a body handed to the caller.
//
// Found in the second review of the hot-path pass (was TestReview2PeekedFinalBodyNotCutLater).
func TestPeekedFinalBodyNotCutLater(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":"something else"}`)
		w.(http.Flusher).Flush()
		time.Sleep(600 * time.Millisecond) // the rest comes late
		io.WriteString(w, strings.Repeat("z", 10))
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:review2-409"), srv.URL, `{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Equal(t, `{"error":"something else"}`+strings.Repeat("z", 10), readAll(t, resp))
}

// lockedBody serializes Read and Close, as many instrumenting wrappers do:
// its Close waits for a Read in progress.
type lockedBody struct {
	mu sync.Mutex
	rc io.ReadCloser
}

func (b *lockedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rc.Read(p)
}

func (b *lockedBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rc.Close()
}

// An *http.Transport may send through a RoundTripper registered for the
// scheme (RegisterProtocol), whose response bodies are not net/http's: a
// discarded 503 body that stalls must still be cut after
// DefaultMaxDrainTime (guarantee 5), and the retry answered, long before
// the server would release it.
//
// It runs under a caller context with a deadline and under one without.
//
// Found in the second review of the hot-path pass (was TestReview2StalledBodyCutThroughRegisteredProtocol).
func TestStalledBodyCutThroughRegisteredProtocol(t *testing.T) {
	t.Parallel()
	for _, deadline := range []bool{true, false} {
		t.Run(map[bool]string{true: "deadline", false: "no-deadline"}[deadline], func(t *testing.T) {
			testStalledBodyCutThroughRegisteredProtocol(t, deadline)
		})
	}
}

func testStalledBodyCutThroughRegisteredProtocol(t *testing.T, deadline bool) {
	release := make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewServer(firstThenCreated(&n, "", func(w http.ResponseWriter, r *http.Request) {
		stallBody(w, r, http.StatusServiceUnavailable, "partial", release)
	}))
	defer srv.Close()
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	// Not cut: the body is released after 15 s, RoundTrip returns, and the
	// test fails on the time it took rather than hanging.
	watchdog := time.AfterFunc(15*time.Second, func() { releaseOnce.Do(func() { close(release) }) })
	defer watchdog.Stop()
	inner := &http.Transport{}
	defer inner.CloseIdleConnections()
	base := &http.Transport{}
	base.RegisterProtocol("http", rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := inner.RoundTrip(r)
		if err == nil {
			resp.Body = &lockedBody{rc: resp.Body}
		}
		return resp, err
	}))
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	require.NoError(t, err)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !deadline {
		ctx = context.Background()
	}
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:review2-altproto"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Less(t, time.Since(start), 5*time.Second, "the stalled body was not cut")
}

// MaybeProcessed is judged per action from every attempt's own writes: an
// action whose first attempt was written (a 503) and whose retry could
// not even connect may have been processed; one none of whose attempts
// could connect was not.
//
// Found in the second review of the hot-path pass (was TestReview2MaybeProcessedAcrossAttempts).
func TestMaybeProcessedAcrossAttempts(t *testing.T) {
	t.Parallel()
	for _, written := range []bool{true, false} {
		t.Run(fmt.Sprint("first written ", written), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			url := srv.URL
			if !written {
				srv.Close()
			}
			var attempts atomic.Int32
			tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2),
				idemretry.WithObserver(func(e idemretry.Event) {
					if e.Kind == idemretry.EventAttempt && attempts.Add(1) == 1 && written {
						srv.Close() // the retries find nobody listening
					}
				}))
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:review2-maybe"), url, `{"amount":1}`))
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got %d, want an error", resp.StatusCode)
			}
			var ae *idemretry.ActionError
			require.True(t, errors.As(err, &ae), "%v", err)
			require.Equal(t, written, ae.MaybeProcessed, "%v", err)
			require.EqualValues(t, 3, attempts.Load())
		})
	}
}

// Nothing of a retried attempt outlives it: after RoundTrip returns (its
// first attempt's 503 or 409 body stalled mid-body and was cut) and the
// answer's body is closed, every connection left is idle, so that closing
// the idle connections leaves no connection goroutine; the server sees
// the stalled request end; and no goroutine of the package is left. Over
// HTTP/1 and HTTP/2, and with a second request reusing the connection.
//
// Found in the second review of the hot-path pass (was TestReview2NothingOfACutAttemptOutlivesIt).
func TestNothingOfACutAttemptOutlivesIt(t *testing.T) {
	for _, proto := range []string{"http1", "http2"} {
		for _, status := range []int{http.StatusServiceUnavailable, http.StatusConflict} {
			t.Run(fmt.Sprint(proto, "/", status), func(t *testing.T) {
				before := persistConnGoroutines() // of earlier tests, if any
				release := make(chan struct{})
				var ended atomic.Int32
				var n atomic.Int32
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					if r.URL.Path != "/stall" || n.Add(1) > 1 {
						w.WriteHeader(http.StatusCreated)
						io.WriteString(w, "ok")
						return
					}
					if stallBody(w, r, status, `{"error":"busy"`, release) {
						ended.Add(1)
					}
				}))
				var base *http.Transport
				if proto == "http2" {
					srv.EnableHTTP2 = true
					srv.StartTLS()
					base = srv.Client().Transport.(*http.Transport)
				} else {
					srv.Start()
					base = &http.Transport{}
				}
				defer srv.Close()
				defer close(release)
				tr, ctx := retryTwiceOver(t, base)
				start := time.Now()
				resp := roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:review2-outlive"), srv.URL+"/stall", `{"amount":1}`))
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				require.Less(t, time.Since(start), 10*time.Second)
				require.Eventually(t, func() bool { return ended.Load() == 1 }, 10*time.Second, 10*time.Millisecond,
					"the stalled request was not ended at the server")
				resp = roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:review2-outlive-2"), srv.URL+"/ok", `{}`))
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				base.CloseIdleConnections()
				require.Eventually(t, func() bool { return persistConnGoroutines() <= before }, 10*time.Second, 10*time.Millisecond,
					"a connection outlived its attempt")
				checkNoPackageGoroutines(t)
			})
		}
	}
}

// A request with a nil header map gets its key on every attempt, and the
// caller's map stays nil; a key header present with no value (nil) in the
// caller's map is not sent beside the minted key.
//
// Found in the second review of the hot-path pass (was TestReview2NilHeaderAndEmptyKeyHeader).
func TestAttemptNilHeaderAndEmptyKeyHeader(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n%2 == 1 {
			status(http.StatusServiceUnavailable)(w)
			return true
		}
		return false
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)))
	for i, hdr := range []http.Header{nil, {"idempotency-key": nil, "Idempotency-Key": {}}} {
		req := post(t, idemretry.WithAction(context.Background(), fmt.Sprint("pay:review2-nilhdr-", i)), srv.URL, `{}`)
		req.Header = hdr
		var want http.Header
		if hdr != nil {
			want = hdr.Clone()
		}
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err, "header %v", hdr)
		resp.Body.Close()
		require.Equal(t, want, req.Header)
		if hdr == nil {
			require.Nil(t, req.Header)
		}
	}
	var keys [][]string
	for _, r := range srv.seen() {
		keys = append(keys, r.Header.Values("Idempotency-Key"))
	}
	require.Len(t, keys, 4)
	for i, k := range keys {
		require.Len(t, k, 1, "request %d sent keys %v", i, k)
		require.NotEmpty(t, k[0])
	}
	require.Equal(t, keys[0], keys[1])
	require.Equal(t, keys[2], keys[3])
	require.NotEqual(t, keys[0], keys[2])
}

// I6: each response the Transport discards is drained and closed; the one
// it returns is the caller's to close.
func TestDiscardedResponsesClosed(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503), status(503))
	rec := &recordingTransport{base: &http.Transport{}}
	defer rec.base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(rec, inMemory(),
		idemretry.WithClock(newFakeClock()))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	bodies := rec.all()
	require.Len(t, bodies, 3)
	assert.True(t, bodies[0].closed() && bodies[1].closed(), "discarded bodies are closed")
	assert.True(t, bodies[0].drained() && bodies[1].drained(), "and drained, so the connection is reused")
	assert.False(t, bodies[2].closed(), "the returned body is left to the caller")
	readAll(t, resp)
	assert.True(t, bodies[2].closed())
	checkNoPackageGoroutines(t)
}

// recordingTransport wraps every response body to see what happens to it.
type recordingTransport struct {
	base   *http.Transport
	mu     sync.Mutex
	bodies []*watchedBody
}

func (r *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	w := &watchedBody{rc: resp.Body}
	resp.Body = w
	r.mu.Lock()
	r.bodies = append(r.bodies, w)
	r.mu.Unlock()
	return resp, nil
}

func (r *recordingTransport) all() []*watchedBody {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*watchedBody(nil), r.bodies...)
}

type watchedBody struct {
	rc       io.ReadCloser
	mu       sync.Mutex
	isClosed bool
	sawEOF   bool
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.rc.Read(p)
	if err == io.EOF {
		w.mu.Lock()
		w.sawEOF = true
		w.mu.Unlock()
	}
	return n, err
}

func (w *watchedBody) Close() error {
	w.mu.Lock()
	w.isClosed = true
	w.mu.Unlock()
	return w.rc.Close()
}

func (w *watchedBody) closed() bool  { w.mu.Lock(); defer w.mu.Unlock(); return w.isClosed }
func (w *watchedBody) drained() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.sawEOF }

// A base RoundTripper that breaks the contract by returning a response and
// an error: the error wins and the response body is closed.
func TestBaseReturningBothIsClosed(t *testing.T) {
	t.Parallel()
	body := &closeTracker{Reader: strings.NewReader("x")}
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: body}, errors.New("broken base")
	})
	tr, err := idemretry.NewTransport(base, inMemory(),
		idemretry.WithClock(newFakeClock()), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(post(t, context.Background(), "http://pay.example/", "x"))
	assert.Nil(t, resp)
	assert.Error(t, err)
	assert.True(t, body.isClosed())
}

// Issue 7, item 12: a 503 whose body stalls must not hang RoundTrip: draining a
// discarded body is bounded in time as well as bytes.
func TestStalledDiscardedBodyIsCut(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.(http.Flusher).Flush()
		for i := 0; i < 300; i++ { // a byte every 100 ms, for 30 s
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprint(w, "x")
			w.(http.Flusher).Flush()
		}
	})
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(2))
	done := make(chan struct{})
	var resp *http.Response
	var err error
	start := time.Now()
	go func() {
		defer close(done)
		resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("RoundTrip hung on a stalled 503 body")
	}
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode)
	resp.Body.Close()
	assert.Less(t, time.Since(start), 10*time.Second)
}

// a retryable 409 whose JSON body stalls: the classifier's peek has no
// bound, so the retries (and RoundTrip) are held until the caller's context
// ends, instead of the 200 ms drain that bounds every discarded body.
func TestStalledErrorBodyDoesNotHoldRetries(t *testing.T) {
	release := make(chan struct{})
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		if n.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":{"code":"idempotency_key_in_use"`)
			w.(http.Flusher).Flush()
			select { // the body stalls
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	})
	defer close(release)
	tr, _, _ := newTestTransport(t, idemretry.WithBackOff(constant(time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:stall"), srv.URL, `{"a":1}`))
	elapsed := time.Since(start)
	if resp != nil {
		resp.Body.Close()
	}
	t.Logf("err=%v elapsed=%v attempts=%d", err, elapsed, n.Load())
	require.Less(t, elapsed, 2*time.Second, "RoundTrip held by a stalled 409 body")
	require.NoError(t, err)
}

// trickle writes status and a long Content-Length, then one byte every
// step until the client goes away.
func trickle(w http.ResponseWriter, r *http.Request, status int, step time.Duration) {
	w.Header().Set("Content-Length", "100000")
	w.WriteHeader(status)
	for range 100000 {
		if _, err := io.WriteString(w, "x"); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(step):
		}
	}
}

// A custom policy reading a trickling 503 body in 1-byte reads, each well
// under DefaultMaxDrainTime: the total is bounded, the retry is answered.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PolicyManySmallReadsBounded).
func TestPolicyManySmallReadsBounded(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			trickle(w, r, http.StatusServiceUnavailable, 20*time.Millisecond)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}))
	defer srv.Close()
	var readErr atomic.Value
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			b := make([]byte, 1)
			for {
				if _, err := resp.Body.Read(b); err != nil {
					readErr.Store(err)
					break
				}
			}
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy), idemretry.WithBackOff(constant(time.Millisecond)))
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:trickle"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "paid", readAll(t, resp))
	require.Less(t, time.Since(start), 15*time.Second)
	require.NotNil(t, readErr.Load())
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// A policy reads the start of a 201, replaces resp.Body with one yielding
// the same bytes, and keeps the original for later; the body's rest comes
// after 3*DefaultMaxDrainTime and the caller reads slowly: nothing is cut.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PolicyReplacesAndKeepsBody).
func TestPolicyReplacesAndKeepsBody(t *testing.T) {
	t.Parallel()
	const rest = 64 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(16+rest))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("h", 16))
		w.(http.Flusher).Flush()
		time.Sleep(3 * idemretry.DefaultMaxDrainTime)
		io.WriteString(w, strings.Repeat("r", rest))
	}))
	defer srv.Close()
	var kept io.ReadCloser
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil {
			head := make([]byte, 16)
			if _, err := io.ReadFull(resp.Body, head); err != nil {
				panic(err)
			}
			kept = resp.Body
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(strings.NewReader(string(head)), kept), kept}
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:replace"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 16+rest, readSlowly(t, resp.Body, 4<<10, 5*time.Millisecond))
}

// KeyReuseRejected peeks at a final 422's JSON body (not a reuse); the
// rest of the body comes after 3*DefaultMaxDrainTime and the caller reads
// it slowly: the final body must not be cut.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PeekThenSlowCallerRead).
func TestPeekThenSlowCallerRead(t *testing.T) {
	t.Parallel()
	head := `{"error":{"type":"invalid_request","message":"` + strings.Repeat("a", 9<<10) + `"}}`
	const tail = 32 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(head)+tail))
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, head)
		w.(http.Flusher).Flush()
		time.Sleep(3 * idemretry.DefaultMaxDrainTime)
		io.WriteString(w, strings.Repeat(" ", tail))
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:peek"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Equal(t, len(head)+tail, readSlowly(t, resp.Body, 1<<10, 2*time.Millisecond))
}

// readSlowly reads body to its end, chunk bytes at a time with a pause
// after each, as a slow caller does, and returns how many bytes it read;
// any error but io.EOF fails t.
func readSlowly(t *testing.T, body io.Reader, chunk int, pause time.Duration) int {
	t.Helper()
	var got int
	buf := make([]byte, chunk)
	for {
		n, err := body.Read(buf)
		got += n
		if err == io.EOF {
			return got
		}
		require.NoError(t, err, "after %d bytes", got)
		time.Sleep(pause)
	}
}

// A custom policy reads the start of a 503 (Retry-After: 0) body, giving it
// back; the 503 is then discarded, and the 201 that follows, judged by a
// policy that takes 2x DefaultMaxDrainTime of its own, arrives whole.
//
// Found in the last review of the attempt context (813580d; was TestRevFinal503ReadByPolicyThenDiscardThenSlowJudged201).
func TestPolicyRead503ThenDiscardThenSlowJudged201(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "busy, try again later")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created-part-1|")
		w.(http.Flusher).Flush()
		time.Sleep(3 * idemretry.DefaultMaxDrainTime / 2)
		io.WriteString(w, "part-2")
	}))
	defer srv.Close()
	var peeked atomic.Value
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			buf := make([]byte, 4)
			k, rerr := io.ReadFull(resp.Body, buf)
			peeked.Store(string(buf[:k]))
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(buf[:k]), resp.Body), resp.Body}
			_ = rerr
		} else if resp != nil {
			time.Sleep(2 * idemretry.DefaultMaxDrainTime)
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rf-503"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "busy", peeked.Load())
	require.Equal(t, "created-part-1|part-2", readAll(t, resp))
	require.EqualValues(t, 2, n.Load())
}

// A policy that goes on reading a stalled 503 body after its budget is
// spent gets errors at once (no second wait), and the retry's 201 arrives
// whole.
//
// Found in the last review of the attempt context (813580d; was TestRevFinalPolicyReadsAfterBudgetSpent).
func TestPolicyReadsAfterDrainBudgetSpent(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	var n atomic.Int32
	srv := httptest.NewServer(firstThenCreated(&n, "paid", func(w http.ResponseWriter, r *http.Request) {
		stallBody(w, r, http.StatusServiceUnavailable, "partial", release)
	}))
	defer srv.Close()
	var after atomic.Int64
	var errs atomic.Int32
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			io.ReadAll(resp.Body) // cut after the budget
			start := time.Now()
			for range 3 {
				if _, rerr := resp.Body.Read(make([]byte, 8)); rerr != nil {
					errs.Add(1)
				}
			}
			after.Store(int64(time.Since(start)))
			return true
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rf-after"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, "paid", readAll(t, resp))
	require.Less(t, time.Since(start), 10*time.Second)
	require.EqualValues(t, 3, errs.Load(), "reads after the cut must fail")
	require.Less(t, time.Duration(after.Load()), 5*time.Second, "reads after the cut must not wait again")
}

// A base whose body returns its last bytes together with io.EOF, read by
// a custom policy, and a 201 with no body (net/http's http.NoBody).
//
// Found in the last review of the attempt context (813580d; was TestRevFinalDataWithEOFAndNoBody).
func TestPolicyReadsDataWithEOFAndNoBody(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "again")
			return
		}
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	hb := &http.Transport{}
	defer hb.CloseIdleConnections()
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := hb.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			resp.Body = struct {
				io.Reader
				io.Closer
			}{&dataWithEOF{r: resp.Body}, resp.Body}
		}
		return resp, err
	})
	var got503 atomic.Value
	var sawNoBody atomic.Bool
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			b, rerr := io.ReadAll(resp.Body)
			require.NoError(t, rerr)
			got503.Store(string(b))
			resp.Body = io.NopCloser(bytes.NewReader(b))
		}
		if resp != nil && resp.StatusCode == http.StatusCreated {
			sawNoBody.Store(resp.Body == http.NoBody)
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr, err := idemretry.NewTransport(base, inMemory(), idemretry.WithRetryPolicy(policy),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rf-nobody"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "", readAll(t, resp))
	require.Equal(t, "again", got503.Load())
	require.True(t, sawNoBody.Load(), "the policy saw a wrapper where net/http gave http.NoBody")
}

// dataWithEOF returns all of r's bytes in its first Read, with io.EOF.
type dataWithEOF struct {
	r    io.Reader
	done bool
}

func (d *dataWithEOF) Read(p []byte) (int, error) {
	if d.done {
		return 0, io.EOF
	}
	d.done = true
	b, err := io.ReadAll(d.r)
	if err != nil {
		return 0, err
	}
	return copy(p, b), io.EOF
}

// Review hV3: README guarantee 5 ("No hopeless waits") and the RoundTrip
// doc's "Waits" paragraph, over real loopback HTTP and journals that hang.

// README guarantee 5: "No wait starts that would end after the context's
// deadline ... RoundTrip returns at once instead." The wait before a retry
// is checked against the deadline when it is drawn, but the discarded
// answer's drain and the attempt count's journal write come between that
// check and the sleep: here the write takes the journal timeout (1 s), so
// the 3 s wait that fitted the 3.5 s left no longer fits, and must not
// start. Before the fix the sleep started anyway and RoundTrip returned
// only at the deadline, with context.DeadlineExceeded.
//
// Found in review hv3 (8c60b37; was TestHV3NoHopelessRetryWaitAfterASlowProgressWrite).
func TestNoHopelessRetryWaitAfterASlowProgressWrite(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	j := &slowProgressJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(time.Second),
		idemretry.WithBackOff(constant(3*time.Second)), idemretry.WithMaxRetries(3))
	ctx, cancel := context.WithTimeout(idemretry.WithAction(context.Background(), "pay:hv3-hopeless"), 3500*time.Millisecond)
	defer cancel()

	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	beforeDeadline := ctx.Err() == nil
	if err == nil {
		err = idemretry.GiveUpReason(resp)
		resp.Body.Close()
	}
	require.NotZero(t, j.progress.Load(), "the attempt count was not written: the test proves nothing")
	require.Equal(t, int32(1), hits.Load())
	require.ErrorIs(t, err, idemretry.ErrWaitExceedsDeadline,
		"a 3 s wait was started with less than 3 s left before the deadline (after the 1 s progress write): %v", err)
	require.True(t, beforeDeadline, "RoundTrip waited for the deadline instead of returning at once")
}

// The recheck before a retry's wait (above) leaves a context that ended
// during the attempt count's write to be reported as the caller's own end:
// the deadline passed, it was not a wait refused for it.
//
// Found in review hv3 (8c60b37; was TestHV3DeadlineDuringTheProgressWriteIsTheCallers).
func TestDeadlineDuringTheProgressWriteIsTheCallers(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	j := &slowProgressJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(3))
	for _, ctx := range []context.Context{
		idemretry.WithAction(context.Background(), "pay:hv3-progress-deadline"),
		idemretry.WithAction(context.Background(), "pay:hv3-progress-nodone"),
	} {
		dl := time.Now().Add(500 * time.Millisecond)
		var cancel context.CancelFunc = func() {}
		if id, _ := idemretry.ActionFromContext(ctx); strings.HasSuffix(id, "nodone") {
			ctx = noDoneContext{Context: ctx, dl: dl}
		} else {
			ctx, cancel = context.WithDeadline(ctx, dl)
		}
		err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":9}`))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.False(t, errors.Is(err, idemretry.ErrWaitExceedsDeadline), "the caller's deadline passed during the write: %v", err)
	}
}

// A request whose context has a deadline, already past, and no Done
// channel sends nothing (attempts' new check) and says so: a
// context.DeadlineExceeded, 0 attempts, not maybe processed. The same
// action sent again with a working context is sent once, under the same
// key, and succeeds.
//
// Found in the review of the lease wait (de94a0c; was TestReviewPastNoDoneDeadlineThenRetry).
func TestPastNoDoneDeadlineSendsNothingThenRetry(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(journal.NewMemory()))
	require.NoError(t, err)
	defer tr.Close()
	ctx := noDoneContext{context.Background(), time.Now().Add(-time.Millisecond)}
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:r4-late"), srv.URL, `{"amount":1}`))
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.Zero(t, ae.Attempts)
	require.False(t, ae.MaybeProcessed)
	require.Empty(t, srv.seen())
	resp, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:r4-late"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	resp.Body.Close()
	srv.requireOnePayment(t, 1)
}
