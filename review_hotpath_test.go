package idemretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Review of the hot-path pass (2d31af3): the BackOff made late, the
// flight's channel made lazily, the returned body's wrapper in the trace,
// the drain timer skipped for the default policy. Real loopback HTTP.

// A caller's BackOff is reset when its RoundTrip begins, as backoff.Retry
// resets one before the first try: an ExponentialBackOff's MaxElapsedTime
// bounds the whole RoundTrip, its first attempt included. A BackOff made
// (and reset) only at the first retry measures from there, and retries an
// action whose budget a slow first attempt had already spent.
func TestReviewCustomBackOffMeasuresFromRoundTrip(t *testing.T) {
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
func TestReviewJoinersAtTheLandingAreWoken(t *testing.T) {
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
func TestReviewJoinerContextEnds(t *testing.T) {
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
func TestReviewBodyAfterRetriesClosedTwice(t *testing.T) {
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
func TestReviewStalledErrorBodiesDoNotHang(t *testing.T) {
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
			ctx, cancel := context.WithTimeout(idemretry.WithRequestOptions(context.Background(), idemretry.RequestRetries(2)), 30*time.Second)
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
func TestReviewKeyReuseRejectedWithDefaultPolicy(t *testing.T) {
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
