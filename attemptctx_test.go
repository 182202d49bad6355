package idemretry_test

import (
	"context"
	"crypto/tls"
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

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// A context derived from a returned response's request context (a reader
// that bounds each read of a streamed body, say) and cancelled must be
// freed, as context.WithCancel's children are, while the body stays open:
// the attempt's context must not keep every context ever derived from it.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxDerivedContextsFreedWhileBodyOpen).
func TestAttemptContextDerivedContextsFreedWhileBodyOpen(t *testing.T) {
	srv := newOpenBodyServer(t)
	tr := transportOver(t, journal.NewMemory())
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:derive"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()

	const n = 2000
	var freed atomic.Int32
	buf := make([]byte, 16)
	for range n {
		ctx, cancel := context.WithCancel(resp.Request.Context())
		runtime.SetFinalizer(ctx, func(any) { freed.Add(1) })
		_, err := resp.Body.Read(buf)
		require.NoError(t, err)
		cancel()
	}
	for i := 0; i < 50 && freed.Load() < n/2; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	require.GreaterOrEqual(t, int(freed.Load()), n/2, "of %d derived contexts, cancelled, only %d were freed while the body is open", n, freed.Load())
}

// Closing the body while other goroutines derive contexts from the
// response's request context and register context.AfterFunc on it: no
// deadlock, every derived context ends, every AfterFunc runs, and a body
// closed twice and read after Close behaves as net/http's.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxCloseRacesDerivation).
func TestAttemptContextCloseRacesDerivation(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("x", 256<<10))
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	for round := range 30 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:race-%d", round)), srv.URL, `{"amount":1}`))
		require.NoError(t, err)
		ctx := resp.Request.Context()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var derived []context.Context
		var ran atomic.Int32
		var registered atomic.Int32
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					switch (g + i) % 3 {
					case 0:
						c, cancel := context.WithCancelCause(ctx)
						defer cancel(nil)
						mu.Lock()
						derived = append(derived, c)
						mu.Unlock()
					case 1:
						c, cancel := context.WithDeadline(ctx, time.Now().Add(time.Hour))
						defer cancel()
						mu.Lock()
						derived = append(derived, c)
						mu.Unlock()
					case 2:
						registered.Add(1)
						context.AfterFunc(ctx, func() { ran.Add(1) })
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp.Body.Close()
			resp.Body.Close()
		}()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("deadlock:\n%s", goroutineStacks())
		}
		for i, c := range derived {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: derived context %d did not end with the attempt", round, i)
			}
			require.ErrorIs(t, context.Cause(c), context.Canceled)
		}
		deadline := time.Now().Add(10 * time.Second)
		for ran.Load() != registered.Load() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		require.Equal(t, registered.Load(), ran.Load(), "AfterFuncs run")
		_, err = resp.Body.Read(make([]byte, 1))
		require.Error(t, err, "read after Close")
		require.ErrorIs(t, ctx.Err(), context.Canceled)
	}
}

// HTTP/2 over TLS under a context that can never end: a streamed answer is
// read whole, and a stalled 503 body is cut after DefaultMaxDrainTime (the
// retry is answered long before the server would release it).
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxHTTP2).
func TestAttemptContextOverHTTP2(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.ProtoMajor != 2 {
			w.WriteHeader(http.StatusHTTPVersionNotSupported)
			return
		}
		if n.Add(1) == 1 {
			stallBody(w, r, http.StatusServiceUnavailable, "partial", release)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("y", 200<<10))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	defer close(release)
	hb := srv.Client().Transport.(*http.Transport).Clone()
	hb.TLSClientConfig = &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	hb.ForceAttemptHTTP2 = true
	defer hb.CloseIdleConnections()
	tr, err := idemretry.NewTransport(hb, inMemory(), idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	require.NoError(t, err)
	defer tr.Close()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:h2"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 2, resp.ProtoMajor)
	require.Less(t, time.Since(start), 10*time.Second, "the stalled 503 was not cut")
	require.Len(t, readAll(t, resp), 200<<10)
	require.Equal(t, int32(2), n.Load())
}

// Redirects through http.Client (each hop a RoundTrip) and a double tap
// sharing one flight, under context.Background: every hop's body is
// closed by the client, the joiners get the answer, and nothing is left.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxRedirectsAndFlights).
func TestAttemptContextThroughRedirectsAndFlights(t *testing.T) {
	var charges atomic.Int32
	gate := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/a":
			http.Redirect(w, r, "/b", http.StatusTemporaryRedirect)
		case "/b":
			http.Redirect(w, r, "/c", http.StatusPermanentRedirect)
		case "/slow":
			<-gate
			charges.Add(1)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
		default:
			charges.Add(1)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "paid")
		}
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	c := &http.Client{Transport: tr}
	for i := range 5 {
		req := post(t, context.Background(), srv.URL+"/a", fmt.Sprintf(`{"amount":%d}`, i))
		resp, err := c.Do(req)
		require.NoError(t, err)
		require.Equal(t, "paid", readAll(t, resp))
	}
	require.Equal(t, int32(5), charges.Load())

	var wg sync.WaitGroup
	bodies := make([]string, 5)
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL+"/slow", `{"amount":9}`))
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body.Close()
			bodies[i] = string(b)
		}()
	}
	time.Sleep(200 * time.Millisecond)
	close(gate)
	wg.Wait()
	for _, b := range bodies {
		require.Equal(t, "paid", b)
	}
	require.Equal(t, int32(6), charges.Load())
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// An attempt ended by the Transport (its body closed) is cancelled with
// context.Canceled: a context derived from it, and the attempt's own, must
// not report as their cause the cause of a context the caller detached
// from.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxCauseIsNotADetachedParentsCause).
func TestAttemptContextCauseIsNotADetachedParentsCause(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	handlerDone := errors.New("the handler that sent the payment returned")
	parent, cancel := context.WithCancelCause(context.Background())
	cancel(handlerDone)
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(detachedContext{parent}, "pay:cause"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	derived, dcancel := context.WithCancel(resp.Request.Context())
	defer dcancel()
	readAll(t, resp) // closes the body: the attempt ends
	<-derived.Done()
	require.Equal(t, context.Canceled, context.Cause(derived), "cause of a context derived from the attempt's")
	require.Equal(t, context.Canceled, context.Cause(resp.Request.Context()), "cause of the attempt's context")
}

// An *http.Transport whose scheme is handed to a RoundTripper registered
// with RegisterProtocol that wraps the context (a tracing one) before its
// own *http.Transport derives from it: no goroutine of the context package
// may watch an open response's attempt context (as TestNoGoroutineWatches
// AnAttemptContext requires of a wrapping base).
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxNoGoroutineWatchesThroughRegisteredProtocol).
func TestAttemptContextNoGoroutineWatchesThroughRegisteredProtocol(t *testing.T) {
	srv := newOpenBodyServer(t)
	type spanKey struct{}
	inner := &http.Transport{}
	defer inner.CloseIdleConnections()
	base := &http.Transport{}
	base.RegisterProtocol("http", rtFunc(func(r *http.Request) (*http.Response, error) {
		return inner.RoundTrip(r.WithContext(context.WithValue(r.Context(), spanKey{}, "span")))
	}))
	tr, err := idemretry.NewTransport(base, inMemory())
	require.NoError(t, err)
	defer tr.Close()
	require.Zero(t, watchedOpenAttempts(t, tr, srv.URL, "pay:alt-watch"),
		"goroutines of the context package watching open attempts' contexts")
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
	t.Parallel()
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
			base := rtFunc(func(r *http.Request) (*http.Response, error) {
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

// Stacked Transports: the outer one's attempt context (an attemptTrace)
// is the inner one's caller context, which carries a trace: the inner
// Transport composes with it, so the outer counts every request the inner
// one writes, retries included, and both send the outer's key.
//
// Found in the second review of the hot-path pass (was TestReview2StackedTransportsCountWrites).
func TestStackedTransportsCountWrites(t *testing.T) {
	t.Parallel()
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
				base = rtFunc(func(r *http.Request) (*http.Response, error) {
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

// Deriving, cancelling and registering AfterFuncs on a response's request
// context concurrently with its Close (end racing stop), under -race.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2StopRacesEnd).
func TestAttemptContextStopRacesEnd(t *testing.T) {
	t.Parallel()
	srv := newOpenBodyServer(t)
	tr := transportOver(t, journal.NewMemory())
	for round := range 40 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:stop-%d", round)), srv.URL, `{}`))
		require.NoError(t, err)
		ctx := resp.Request.Context()
		var wg sync.WaitGroup
		var ran, stopped atomic.Int32
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 100 {
					switch (g + i) % 3 {
					case 0:
						_, cancel := context.WithCancel(ctx)
						cancel()
					case 1:
						_, cancel := context.WithDeadline(ctx, time.Now().Add(time.Duration(i%3)*time.Microsecond))
						cancel()
					case 2:
						stop := context.AfterFunc(ctx, func() { ran.Add(1) })
						if i%2 == 0 && stop() {
							stopped.Add(1)
						}
					}
				}
			}()
		}
		if round%2 == 0 {
			runtime.Gosched()
		}
		resp.Body.Close()
		wg.Wait()
		require.ErrorIs(t, ctx.Err(), context.Canceled)
	}
}

// Contexts derived from a response's request context through a value of
// the caller's (context.WithValue, as loggers and tracers add) while the
// body is open: none should need a goroutine of the context package to
// watch the attempt (none did before 5b944f9, whose attempt context was a
// context.WithCancel, found through the value layer).
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2ValueWrappedDerivationsNeedNoGoroutine).
func TestAttemptContextValueWrappedDerivationsNeedNoGoroutine(t *testing.T) {
	srv := newOpenBodyServer(t)
	tr := transportOver(t, journal.NewMemory())
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:value-derive"), srv.URL, `{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	type logKey struct{}
	var cancels []context.CancelFunc
	for range 20 {
		ctx, cancel := context.WithTimeout(context.WithValue(resp.Request.Context(), logKey{}, "req-1"), time.Hour)
		_ = ctx
		cancels = append(cancels, cancel)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	n := strings.Count(goroutineStacks(), "created by context.(*cancelCtx).propagateCancel")
	require.Zero(t, n, "goroutines of the context package watching an open attempt's context")
}

// Printing the context of a returned response's request (a debug log of
// req.Context() in a base or a handler) must not print the request's
// headers: an Authorization header is a credential.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PrintedContextHoldsNoCredential).
func TestAttemptContextPrintedHoldsNoCredential(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	req := post(t, idemretry.WithAction(context.Background(), "pay:print"), srv.URL, `{"amount":1}`)
	req.Header.Set("Authorization", "Bearer sk_live_SECRET")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	printed := fmt.Sprintf("%v", resp.Request.Context())
	require.NotContains(t, printed, "sk_live_SECRET", "fmt of the attempt's context: %.300s", printed)
}

// A give-up's context: Deadline, Value and GiveUpReason through contexts
// derived from it (WithoutCancel, WithDeadline, AfterFunc), and its end
// with the body's Close.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2GiveUpContextDerived).
func TestGiveUpContextDerived(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, strings.Repeat("x", 256<<10))
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(1), idemretry.WithBackOff(constant(time.Millisecond)))
	type k struct{}
	for _, withDeadline := range []bool{false, true} {
		ctx := context.WithValue(context.Background(), k{}, "v")
		dl := time.Now().Add(time.Hour)
		if withDeadline {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl)
			defer cancel()
		}
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, fmt.Sprintf("pay:giveup-%v", withDeadline)), srv.URL, `{}`))
		require.NoError(t, err)
		require.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted)
		rc := resp.Request.Context()
		d, ok := rc.Deadline()
		require.Equal(t, withDeadline, ok)
		if ok {
			require.WithinDuration(t, dl, d, time.Second)
		}
		require.Equal(t, "v", rc.Value(k{}))
		wc := context.WithoutCancel(rc)
		require.Equal(t, "v", wc.Value(k{}))
		dctx, dcancel := context.WithDeadline(rc, time.Now().Add(time.Hour))
		defer dcancel()
		ran := make(chan struct{})
		context.AfterFunc(rc, func() { close(ran) })
		_ = fmt.Sprint(rc)
		require.NoError(t, rc.Err())
		resp.Body.Close()
		for _, c := range []<-chan struct{}{dctx.Done(), ran} {
			select {
			case <-c:
			case <-time.After(10 * time.Second):
				t.Fatal("derived context did not end with the body's Close")
			}
		}
		require.True(t, errors.Is(context.Cause(dctx), context.Canceled))
		require.NoError(t, wc.Err())
	}
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// Printing a response's request context while another goroutine closes
// the body: under -race, fmt's reads of the attempt's fields race with
// end's writes.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PrintedContextRacesClose).
func TestAttemptContextPrintedRacesClose(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	for i := range 20 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:print-race-%d", i)), srv.URL, `{}`))
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = fmt.Sprintf("%v", resp.Request.Context()) }()
		resp.Body.Close()
		<-done
	}
}

// HTTP/2 under context.Background: open answers' contexts are watched by
// no goroutine of the context package, and contexts derived and cancelled
// while a body is open are freed.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2HTTP2OpenBodies).
func TestAttemptContextOfOpenBodiesOverHTTP2(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("y", 256<<10))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	hb := srv.Client().Transport.(*http.Transport).Clone()
	hb.ForceAttemptHTTP2 = true
	defer hb.CloseIdleConnections()
	tr, err := idemretry.NewTransport(hb, inMemory())
	require.NoError(t, err)
	defer tr.Close()
	var open []*http.Response
	for i := range 8 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:h2open-%d", i)), srv.URL, `{}`))
		require.NoError(t, err)
		require.Equal(t, 2, resp.ProtoMajor)
		open = append(open, resp)
	}
	require.Zero(t, strings.Count(goroutineStacks(), "created by context.(*cancelCtx).propagateCancel"))
	const n = 1000
	var freed atomic.Int32
	for range n {
		ctx, cancel := context.WithCancel(open[0].Request.Context())
		runtime.SetFinalizer(ctx, func(any) { freed.Add(1) })
		cancel()
	}
	for i := 0; i < 50 && freed.Load() < n/2; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	require.GreaterOrEqual(t, int(freed.Load()), n/2)
	for _, resp := range open {
		require.Len(t, readAll(t, resp), 256<<10)
	}
	hb.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}
