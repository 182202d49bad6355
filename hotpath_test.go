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
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

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
		base = roundTripperFunc(hb.RoundTrip)
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

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// journalContext makes no timer of its own when the caller's deadline comes
// first: the journal call is then bounded by that deadline (the caller's
// own end, not an unavailable journal), and otherwise still by the journal
// timeout (journal.ErrUnavailable), both with nothing sent (guarantee 5).
func TestJournalCallBoundedByTheEarlierOfDeadlineAndTimeout(t *testing.T) {
	for _, tc := range []struct {
		name              string
		deadline, timeout time.Duration
		want              error
	}{
		{"deadline first", 300 * time.Millisecond, time.Minute, context.DeadlineExceeded},
		{"timeout first", time.Minute, 300 * time.Millisecond, journal.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
				idemretry.WithJournalTimeout(tc.timeout))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			_, err = tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:bounded"), srv.URL, `{"amount":1}`))
			elapsed := time.Since(start)
			require.ErrorIs(t, err, tc.want)
			if tc.want == context.DeadlineExceeded {
				require.NotErrorIs(t, err, journal.ErrUnavailable)
			}
			require.Less(t, elapsed, 20*time.Second)
			require.Empty(t, srv.seen())
		})
	}
}

// stallingMemory embeds a Memory, and so its NeverBlocks method, but its
// Reserve stalls until its context ends: the claim that a Memory never
// blocks must not pass to it, or the journal timeout would not bound it.
type stallingMemory struct{ *journal.Memory }

func (s stallingMemory) Reserve(ctx context.Context, _ journal.Record, _ journal.ReserveMode) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// The journal timeout bounds a journal that embeds journal.Memory: the
// Transport skips its timers only for a journal that says of itself that
// it never blocks (journal.NonBlocker), never for one that inherits the
// method.
func TestNonBlockerClaimIsNotInherited(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(stallingMemory{journal.NewMemory()}),
		idemretry.WithJournalTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, journal.ErrUnavailable) {
			t.Fatalf("RoundTrip: %v, want journal.ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RoundTrip still waiting for the stalled journal 30 s after a 50 ms journal timeout")
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests sent without a reserved key", n)
	}
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

// Callers of one unnamed action arriving while its leader lands, round
// after round: a joiner must never wait for a wake-up that does not come
// (the flight's channel is made only when someone joins). Every call
// returns well before its generous deadline, with an answer.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewJoinersAtTheLandingAreWoken).
func TestFlightJoinersAtTheLandingAreWoken(t *testing.T) {
	var charges atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	tr, _, _ := newTestTransport(t)
	const rounds, callers = 150, 6
	var calls atomic.Int32
	for round := range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var wg sync.WaitGroup
		errc := make(chan error, callers)
		start := make(chan struct{})
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := tr.RoundTrip(post(t, ctx, srv.URL, fmt.Sprintf(`{"round":%d}`, round)))
				if err != nil {
					errc <- err
					return
				}
				calls.Add(1)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				resp.Body.Close() // a second Close is harmless
				if err != nil || resp.StatusCode != http.StatusCreated || string(b) != `{"ok":true}` {
					errc <- fmt.Errorf("round %d: %d %q %v", round, resp.StatusCode, b, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		cancel()
		close(errc)
		for err := range errc {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	t.Logf("%d calls, %d requests charged", calls.Load(), charges.Load())
	require.Equal(t, int32(rounds*callers), calls.Load())
	require.LessOrEqual(t, charges.Load(), int32(rounds*callers))
}

// A joiner whose own context ends stops waiting with its context's error;
// the leader's answer is unaffected, and one request was sent.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewJoinerContextEnds).
func TestFlightJoinersOwnContextEndsItsWait(t *testing.T) {
	srv := newSlowPayServer(t, 400*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	var leaderResp *http.Response
	var leaderErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		leaderResp, leaderErr = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":7}`))
	}()
	<-srv.arrived
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":7}`))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	<-done
	require.NoError(t, leaderErr)
	require.Equal(t, http.StatusCreated, leaderResp.StatusCode)
	readAll(t, leaderResp)
	require.NoError(t, leaderResp.Body.Close(), "a second Close")
	require.Equal(t, 1, srv.chargeCount())
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

func transportWithConstant(t *testing.T) (*idemretry.Transport, journal.Journal, struct{}) {
	t.Helper()
	j := journal.NewMemory()
	base := &http.Transport{}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithBackOff(constant(time.Millisecond)))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, tr.Close())
		base.CloseIdleConnections()
		checkNoPackageGoroutines(t)
	})
	return tr, j, struct{}{}
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

// A key refused as reused is still recognised with the default policy on
// each of the three statuses whose bodies it reads.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewKeyReuseRejectedWithDefaultPolicy).
func TestKeyReuseRejectedWithDefaultPolicy(t *testing.T) {
	for _, c := range []struct {
		code int
		body string
	}{
		{http.StatusBadRequest, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}`},
		{http.StatusConflict, `{"code":"idempotency_key_reused"}`},
		{http.StatusUnprocessableEntity, `{"type":"about:blank","title":"Idempotency-Key is already used"}`},
	} {
		t.Run(fmt.Sprint(c.code), func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				hits.Add(1)
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(c.code)
				io.WriteString(w, c.body)
			}))
			t.Cleanup(srv.Close)
			tr, _, _ := transportWithConstant(t)
			_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":4}`))
			require.ErrorIs(t, err, idemretry.ErrKeyReused)
			require.Equal(t, int32(1), hits.Load())
		})
	}
}

// Review of the second hot-path pass (666b1be, 8d51a09, 2102882, b5ea642,
// 97249ff): attempts through an *http.Transport without a cancel of their
// own, the flight's attempt trace, the fingerprint read in place, the
// journal bound without a timer, the header copied in one pass. Real
// loopback HTTP.

// fpJournal is a journal.Memory that keeps the fingerprint of every
// record it is asked to reserve.
type fpJournal struct {
	*journal.Memory
	mu  sync.Mutex
	fps []journal.Fingerprint
}

func (j *fpJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	j.mu.Lock()
	j.fps = append(j.fps, rec.Fingerprint)
	j.mu.Unlock()
	return j.Memory.Reserve(ctx, rec, mode)
}

func (j *fpJournal) last(t *testing.T) journal.Fingerprint {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	require.NotEmpty(t, j.fps)
	return j.fps[len(j.fps)-1]
}

// The fingerprint names unnamed actions and is stored in journals across
// restarts: it must be what it was before the in-place hashing, the
// SHA-256 of the bytes GetBody gives, for every request. http.NewRequest's
// GetBody is a snapshot taken when the request was made; a Body read or
// written to after that, or replaced, no longer holds the same bytes
// (and the retries send GetBody's). Each request here must get the
// fingerprint of a fresh request whose body is GetBody's bytes.
//
// Found in the second review of the hot-path pass (was TestReview2FingerprintIsGetBodysAfterBodyChanged).
func TestFingerprintIsGetBodysAfterBodyChanged(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	const payload = `{"amount":100,"currency":"eur"}`
	cases := map[string]func(t *testing.T) *http.Request{
		"bytes.Reader read after NewRequest": func(t *testing.T) *http.Request {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", bytes.NewReader([]byte(payload)))
			require.NoError(t, err)
			_, err = io.ReadFull(req.Body, make([]byte, 5))
			require.NoError(t, err)
			return req
		},
		"strings.Reader read after NewRequest": func(t *testing.T) *http.Request {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payload))
			require.NoError(t, err)
			_, err = io.ReadFull(req.Body, make([]byte, 5))
			require.NoError(t, err)
			return req
		},
		"bytes.Buffer written after NewRequest": func(t *testing.T) *http.Request {
			buf := bytes.NewBufferString(payload)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", buf)
			require.NoError(t, err)
			buf.WriteString(`,"extra":1`)
			return req
		},
		"Body replaced, GetBody kept": func(t *testing.T) *http.Request {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payload))
			require.NoError(t, err)
			req.Body = io.NopCloser(strings.NewReader(`{"amount":1,"currency":"eur"}`))
			return req
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			j := &fpJournal{Memory: journal.NewMemory()}
			tr := transportOver(t, j)
			ref, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payload))
			require.NoError(t, err)
			roundTrip(t, tr, ref)
			want := j.last(t)

			req := mk(t)
			gb, err := req.GetBody()
			require.NoError(t, err)
			got, _ := io.ReadAll(gb)
			require.Equal(t, payload, string(got), "GetBody gives the request's snapshot")
			if resp, err := tr.RoundTrip(req); err == nil { // what is sent does not matter here
				resp.Body.Close()
			}
			require.Equal(t, want, j.last(t), "the fingerprint is no longer the one of GetBody's bytes")
		})
	}
}

// The same split seen by a named action: a second request of the action,
// whose GetBody gives the same payload, is the same payload (a resend
// answered from the journal), not ErrFingerprintMismatch.
//
// Found in the second review of the hot-path pass (was TestReview2NamedActionResendWithReadBodyIsSamePayload).
func TestFingerprintOfANamedResendWithReadBodyIsTheSamePayload(t *testing.T) {
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	ctx := idemretry.WithAction(context.Background(), "pay:review2-read-body")
	roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":100}`))
	req := post(t, ctx, srv.URL, `{"amount":100}`)
	_, err := io.ReadFull(req.Body, make([]byte, 3)) // e.g. a logging middleware that peeked
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	require.False(t, errors.Is(err, idemretry.ErrFingerprintMismatch), "a resend of the same GetBody payload refused: %v", err)
}

// Hashing in place must not consume or move the caller's Body: with a body
// net/http can rewind, and one it cannot (read into memory), the server
// gets the whole payload on the first attempt, and the caller's reader is
// where it was.
//
// Found in the second review of the hot-path pass (was TestReview2FingerprintLeavesCallerBodyAlone).
func TestFingerprintLeavesCallerBodyAlone(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	payload := strings.Repeat("x", 5000)
	for _, name := range []string{"strings.Reader", "bytes.Reader", "bytes.Buffer", "empty", "NoBody"} {
		t.Run(name, func(t *testing.T) {
			var body io.Reader
			want := payload
			switch name {
			case "strings.Reader":
				body = strings.NewReader(payload)
			case "bytes.Reader":
				body = bytes.NewReader([]byte(payload))
			case "bytes.Buffer":
				body = bytes.NewBufferString(payload)
			case "empty":
				body, want = strings.NewReader(""), ""
			case "NoBody":
				body, want = http.NoBody, ""
			}
			req, err := http.NewRequest(http.MethodPost, srv.URL, body)
			require.NoError(t, err)
			before := *req
			hdr := req.Header.Clone()
			roundTrip(t, tr, req)
			require.Equal(t, want, got.Load())
			require.Equal(t, hdr, req.Header, "the caller's header was changed")
			require.True(t, before.Body == req.Body && before.ContentLength == req.ContentLength, "the caller's request was changed")
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
	base.RegisterProtocol("http", roundTripperFunc(func(r *http.Request) (*http.Response, error) {
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

// An attempt's context is its attemptTrace (4e07089): the Transport's
// write count must compose with traces of others. A caller's trace on its
// context still sees every write, a base that adds a trace of its own
// (httptrace.WithClientTrace over the attempt's context, as tracing
// wrappers do) still lets the Transport count them, and the caller's
// context values reach the base. Stats.Attempts counts the requests
// written: a base that sends each attempt twice (stacked retries) writes 2.
//
// Found in the second review of the hot-path pass (was TestReview2TracesCompose).
func TestAttemptTracesCompose(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1)%2 == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	type ctxKey struct{}
	for _, kind := range []string{"plain", "caller-trace", "base-trace"} {
		t.Run(kind, func(t *testing.T) {
			inner := &http.Transport{}
			defer inner.CloseIdleConnections()
			var baseWrites, callerWrites atomic.Int32
			var sawValue atomic.Bool
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				sawValue.Store(r.Context().Value(ctxKey{}) == "v")
				if kind == "base-trace" {
					r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
						WroteRequest: func(httptrace.WroteRequestInfo) { baseWrites.Add(1) },
					}))
				}
				// A stacked retry: a 503 is sent again once, by the base.
				resp, err := inner.RoundTrip(r)
				if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
					return resp, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				r2 := r.Clone(r.Context())
				r2.Body, _ = r.GetBody()
				return inner.RoundTrip(r2)
			})
			tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()))
			require.NoError(t, err)
			defer tr.Close()
			ctx := context.WithValue(context.Background(), ctxKey{}, "v")
			if kind == "caller-trace" {
				ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { callerWrites.Add(1) },
				})
			}
			resp := roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:review2-trace-"+kind), srv.URL, `{"amount":1}`))
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.True(t, sawValue.Load(), "the caller's context value did not reach the base")
			require.EqualValues(t, 2, tr.Stats().Attempts, "requests written, as the Transport counted them")
			switch kind {
			case "caller-trace":
				require.EqualValues(t, 2, callerWrites.Load())
			case "base-trace":
				require.EqualValues(t, 2, baseWrites.Load())
			}
		})
	}
}

// MaybeProcessed is judged per action from every attempt's own writes: an
// action whose first attempt was written (a 503) and whose retry could
// not even connect may have been processed; one none of whose attempts
// could connect was not.
//
// Found in the second review of the hot-path pass (was TestReview2MaybeProcessedAcrossAttempts).
func TestMaybeProcessedAcrossAttempts(t *testing.T) {
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

// persistConnGoroutines counts net/http's client connection goroutines
// (HTTP/1 read and write loops, HTTP/2 read loops) of the whole process.
func persistConnGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "net/http.(*persistConn).readLoop") || strings.Contains(g, "net/http.(*persistConn).writeLoop") ||
			strings.Contains(g, "net/http.(*http2ClientConn).readLoop") || strings.Contains(g, "net/http.(*http2clientConnReadLoop)") {
			n++
		}
	}
	return n
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

// Stacked Transports: the outer one's attempt context (an attemptTrace)
// is the inner one's caller context, which carries a trace: the inner
// Transport composes with it, so the outer counts every request the inner
// one writes, retries included, and both send the outer's key.
//
// Found in the second review of the hot-path pass (was TestReview2StackedTransportsCountWrites).
func TestStackedTransportsCountWrites(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	var n atomic.Int32
	busy := firstThenCreated(&n, "", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		busy(w, r)
	}))
	defer srv.Close()
	inner := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)))
	outer, err := idemretry.NewTransport(inner, idemretry.WithJournal(journal.NewMemory()))
	require.NoError(t, err)
	defer outer.Close()
	resp := roundTrip(t, outer, post(t, idemretry.WithAction(context.Background(), "pay:review2-stacked"), srv.URL, `{"amount":1}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 2, inner.Stats().Attempts)
	require.EqualValues(t, 2, outer.Stats().Attempts, "the outer Transport did not see the inner one's writes")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1])
}

// firstThenCreated is a handler that reads each request's body, answers the
// first request with first and every later one with 201 Created and body;
// n counts the requests.
func firstThenCreated(n *atomic.Int32, body string, first http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, body)
			return
		}
		first(w, r)
	}
}

// No attempt's context is watched by a goroutine of the context package,
// whatever the base does with it: net/http's *http.Transport derives each
// request's context from the attempt's directly, and a base may first wrap
// it in a value of its own (as tracing transports do); the context package
// links either to the attempt's context.WithCancel (attemptctx.go).
// Responses are held open, their requests' contexts alive, while the
// goroutines are listed.
func TestNoGoroutineWatchesAnAttemptContext(t *testing.T) {
	srv := newOpenBodyServer(t)
	type traceKey struct{}
	for _, wrap := range []bool{false, true} {
		t.Run(map[bool]string{false: "net/http", true: "wrapping base"}[wrap], func(t *testing.T) {
			hb := &http.Transport{}
			defer hb.CloseIdleConnections()
			var base http.RoundTripper = hb
			if wrap {
				base = roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					return hb.RoundTrip(r.WithContext(context.WithValue(r.Context(), traceKey{}, "span")))
				})
			}
			tr, err := idemretry.NewTransport(base, inMemory())
			require.NoError(t, err)
			defer tr.Close()
			require.Zero(t, watchedOpenAttempts(t, tr, srv.URL, fmt.Sprintf("pay:watch-%v", wrap)),
				"goroutines of the context package watching open attempts' contexts")
		})
	}
}
