package idemretry_test

// An answer read to its end lets go of its attempt, as net/http lets go of
// a request at its answer's end, whether or not the caller closes it.
// Issue 26, item 6.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// appContext is a caller's context of the app's own type: it hides every
// value, the context package's own included, so the context package
// watches each context derived from it with a goroutine.
type appContext struct{ context.Context }

func (appContext) Value(any) any { return nil }

// payloadBody is a request body the test can watch the Transport hold.
type payloadBody struct{ r *strings.Reader }

func (b *payloadBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *payloadBody) Close() error               { return nil }

// Answers read to their end and dropped without Close, under a caller's
// context that lives on: every attempt is released (its context ended, its
// request body free), and no goroutine of the context package is left
// watching for it. Before: 0 of 200 bodies freed, ~14.7 MiB held, +203
// goroutines.
func TestAnswerReadToItsEndReleasesItsAttempt(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	})
	tr, _, _ := newTestTransport(t)
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := appContext{parent}

	const n = 200
	payload := strings.Repeat("x", 64<<10)
	watched := make([]weak.Pointer[payloadBody], 0, n)
	ended := 0 // attempts whose context ended with their answer's end
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := countGoroutines("created by context.(*cancelCtx).propagateCancel")
	send := func(i int, getBody bool) {
		body := fmt.Sprintf("%d:%s", i, payload)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		pb := &payloadBody{strings.NewReader(body)}
		req.Body, req.ContentLength = pb, int64(len(body))
		if getBody { // streamed: the attempt sends pb itself
			req.GetBody = func() (io.ReadCloser, error) { return &payloadBody{strings.NewReader(body)}, nil }
			watched = append(watched, weak.Make(pb))
		} // else buffered by the Transport, pb closed and dropped at once
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		_, err = io.ReadAll(resp.Body) // to its end; never closed
		require.NoError(t, err)
		if resp.Request.Context().Err() != nil {
			ended++
		}
	}
	for i := range n {
		send(i, i%2 == 0)
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	freed := 0
	for _, w := range watched {
		if w.Value() == nil {
			freed++
		}
	}
	var g int
	deadline := time.Now().Add(5 * time.Second) // the watchers end as their contexts do, on goroutines of their own
	for g = countGoroutines("created by context.(*cancelCtx).propagateCancel"); g > g0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		g = countGoroutines("created by context.(*cancelCtx).propagateCancel")
	}
	t.Logf("%d answers read to their end, not closed: %d attempts ended, %d of %d streamed request bodies freed, heap %+.1f MiB, context watchers %d -> %d",
		n, ended, freed, len(watched), float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), g0, g)
	require.Equal(t, n, ended, "every attempt ends with its answer's end")
	require.Equal(t, len(watched), freed, "every request body is freed once its answer was read to its end")
	require.LessOrEqual(t, g, g0, "no goroutine watches the caller's context for a finished attempt")
}

// countGoroutines counts the goroutines whose stack holds s.
func countGoroutines(s string) int { return strings.Count(goroutineStacks(), s) }

// A body read to its end, then closed twice, and one closed from another
// goroutine as it is read to its end: no panic, no race, Close answers as
// net/http's does, and the attempt is released.
func TestAnswerEndThenCloseTwiceAndFromAnotherGoroutine(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("y", 32<<10))
	})
	tr, _, _ := newTestTransport(t)
	for i := range 20 {
		req := post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:close-%d", i)), srv.URL, `{"amount":1}`)
		if i%2 == 1 {
			ch := make(chan struct{})
			req.Cancel = ch //lint:ignore SA1019 and through the Cancel watch's body
			defer close(ch)
		}
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		if i%4 < 2 {
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Len(t, b, 32<<10)
			require.NoError(t, resp.Body.Close())
			require.NoError(t, resp.Body.Close(), "a second Close, as net/http's")
			n, err := resp.Body.Read(make([]byte, 1))
			require.Zero(t, n)
			require.Error(t, err, "a Read after Close")
			continue
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp.Body.Close()
		}()
		wg.Wait()
		require.NoError(t, resp.Body.Close())
	}
}

// Over HTTP/2, an answer read to its end and closed leaves its connection
// idle, so that closing the idle connections right after leaves none: the
// end of the body lets go of its stream before its attempt's context ends
// (an HTTP/2 body closed under an ended context does not wait for that).
// Before (the context ended at io.EOF, then Close): a connection left open
// in 11 of 20 HTTP/2 runs of TestNothingOfACutAttemptOutlivesIt.
func TestAnswerReadToItsEndLeavesAnHTTP2ConnectionIdle(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	base := srv.Client().Transport.(*http.Transport)
	tr, err := idemretry.NewTransport(base, inMemory())
	require.NoError(t, err)
	defer tr.Close()
	before := persistConnGoroutines()
	for i := range 30 {
		resp := roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:h2-%d", i)), srv.URL, `{"amount":1}`))
		require.Equal(t, 2, resp.ProtoMajor)
		base.CloseIdleConnections()
		require.Eventually(t, func() bool { return persistConnGoroutines() <= before }, 5*time.Second, 5*time.Millisecond,
			"request %d: its connection was not idle when its body was closed", i)
	}
}
