package idemretry_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
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

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("no entropy") }

// A process whose crypto/rand.Reader fails (replaced, or a legacy Linux
// without getrandom whose /dev/urandom cannot be opened) gets an error from
// RoundTrip, not a crash: minting a key must not take the process down.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxFailingRandReaderIsAnErrorNotACrash).
func TestKeyFromAFailingRandReaderIsAnErrorNotACrash(t *testing.T) {
	if os.Getenv("IDEMRETRY_REVIEW_RAND_CHILD") == "1" {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
		}))
		defer srv.Close()
		tr, err := idemretry.NewTransport(&http.Transport{}, inMemory())
		require.NoError(t, err)
		defer tr.Close()
		rand.Reader = failingReader{}
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rand"), srv.URL, `{"amount":1}`))
		if err == nil {
			resp.Body.Close()
		}
		fmt.Println("RoundTrip returned:", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeyFromAFailingRandReaderIsAnErrorNotACrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMRETRY_REVIEW_RAND_CHILD=1")
	out, err := cmd.CombinedOutput()
	first := strings.SplitN(string(out), "\n", 2)[0]
	require.NoError(t, err, "the child process crashed: %s", first)
}

// detached is a context that keeps its parent's values but never ends, as
// hand-written "detach" contexts did before context.WithoutCancel (its
// Value passes every key on, the context package's own too).
type detached struct{ parent context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Done() <-chan struct{}       { return nil }
func (detached) Err() error                  { return nil }
func (d detached) Value(key any) any         { return d.parent.Value(key) }

// An attempt ended by the Transport (its body closed) is cancelled with
// context.Canceled: a context derived from it, and the attempt's own, must
// not report as their cause the cause of a context the caller detached
// from.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxCauseIsNotADetachedParentsCause).
func TestAttemptContextCauseIsNotADetachedParentsCause(t *testing.T) {
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
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(detached{parent}, "pay:cause"), srv.URL, `{"amount":1}`))
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
	base.RegisterProtocol("http", roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		return inner.RoundTrip(r.WithContext(context.WithValue(r.Context(), spanKey{}, "span")))
	}))
	tr, err := idemretry.NewTransport(base, inMemory())
	require.NoError(t, err)
	defer tr.Close()
	require.Zero(t, watchedOpenAttempts(t, tr, srv.URL, "pay:alt-watch"),
		"goroutines of the context package watching open attempts' contexts")
}

// A policy of the caller's that takes longer than DefaultMaxDrainTime to
// call a 201 final (it reads no body: it logs, asks a slow service...)
// must not cut the body of the answer it lets through.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxSlowPolicyDoesNotCutTheFinalBody).
func TestSlowPolicyDoesNotCutTheFinalBody(t *testing.T) {
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
