package idemretry_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// Every attempt carries the same bytes, with GetBody and without.
func TestBodyIdenticalOnEveryAttempt(t *testing.T) {
	payload := strings.Repeat(`{"line":"0123456789abcdef"}`, 2000)
	want := sha256.Sum256([]byte(payload))
	bodies := map[string]func() io.Reader{
		"GetBody":  func() io.Reader { return strings.NewReader(payload) },
		"buffered": func() io.Reader { return onlyReader{strings.NewReader(payload)} },
	}
	for name, mk := range bodies {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(status(500), status(502), status(503))
			tr, _, _ := newTestTransport(t)
			req, err := http.NewRequest(http.MethodPost, srv.URL, mk())
			require.NoError(t, err)
			roundTrip(t, tr, req)
			reqs := srv.seen()
			require.Len(t, reqs, 4)
			for _, r := range reqs {
				assert.Equal(t, want, r.BodyHash)
			}
		})
	}
}

// A body that cannot be rewound and is over the buffering limit is refused
// before anything is sent, and closed.
func TestNonRewindableBodyOverLimitRefused(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithMaxBufferedBody(1024))
	body := &closeTracker{Reader: bytes.NewReader(make([]byte, 1025))}
	req, err := http.NewRequest(http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	require.Nil(t, req.GetBody)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, idemretry.ErrBodyTooLarge)
	assert.Empty(t, srv.seen())
	assert.True(t, body.isClosed())

	// At the limit it is buffered and retried intact.
	srv.script = scriptFirst(status(503))
	body = &closeTracker{Reader: bytes.NewReader(make([]byte, 1024))}
	req, err = http.NewRequest(http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	roundTrip(t, tr, req)
	assert.Len(t, srv.seen(), 2)
	assert.True(t, body.isClosed())
}

// I6: the caller's request is left exactly as it was.
func TestCallerRequestNotMutated(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	tr, _, _ := newTestTransport(t)
	req := post(t, idemretry.WithAction(context.Background(), "pay:i6"), srv.URL, "abc")
	req.Header.Set("X-Trace", "1")
	before := req.Header.Clone()
	getBody := req.GetBody
	roundTrip(t, tr, req)
	assert.Equal(t, before, req.Header, "no key header added to the caller's request")
	assert.NotNil(t, getBody)
	rc, err := req.GetBody()
	require.NoError(t, err)
	b, _ := io.ReadAll(rc)
	assert.Equal(t, "abc", string(b))
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

// Invalid requests get a typed error, never a panic.
func TestInvalidRequests(t *testing.T) {
	tr, _, _ := newTestTransport(t)
	_, err := tr.RoundTrip(nil)
	assert.ErrorIs(t, err, idemretry.ErrInvalidRequest)
	_, err = tr.RoundTrip(&http.Request{Method: http.MethodPost})
	assert.ErrorIs(t, err, idemretry.ErrInvalidRequest)
	req, _ := http.NewRequest(http.MethodPost, "/relative", nil)
	_, err = tr.RoundTrip(req)
	assert.ErrorIs(t, err, idemretry.ErrInvalidRequest)
	_, err = idemretry.NewTransport(nil, inMemory(), idemretry.WithKeyWindow(0))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
}

func TestInvalidOptions(t *testing.T) {
	j := inMemory()
	for name, o := range map[string]idemretry.Option{
		"zero window":       idemretry.WithKeyWindow(0),
		"negative cap":      idemretry.WithMaxRetryAfter(-time.Second),
		"empty header":      idemretry.WithKeyHeader(""),
		"header with colon": idemretry.WithKeyHeader("Idempotency:Key"),
		"header with space": idemretry.WithKeyHeader("Idempotency Key"),
		"negative buffer":   idemretry.WithMaxBufferedBody(-1),
		"negative retries":  idemretry.WithMaxRetries(-1),
		"negative share":    idemretry.WithMaxSharedResponse(-1),
		"zero jtimeout":     idemretry.WithJournalTimeout(0),
	} {
		_, err := idemretry.NewTransport(nil, j, o)
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption, name)
	}
	_, err := idemretry.NewTransport(nil, j, idemretry.WithKeyHeader("X-Idempotency-Key"), nil)
	assert.NoError(t, err, "a nil Option is skipped")
	_, err = idemretry.NewTransport(nil, j, idemretry.WithBackOff(nil), idemretry.WithRetryPolicy(nil),
		idemretry.WithClock(nil), idemretry.WithKeyGenerator(nil))
	assert.NoError(t, err, "a nil function restores the default")
}

// A huge key window must not overflow the retention of the journal it opens.
func TestHugeKeyWindowOpensJournal(t *testing.T) {
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()), idemretry.WithKeyWindow(1<<62))
	require.NoError(t, err)
	require.NoError(t, tr.Close())
}

// A Transport with no base gets its own clone of http.DefaultTransport, so
// closing it closes nobody else's connections; and WithJournal with
// WithJournalDir is a mistake, refused.
func TestNewTransportDefaults(t *testing.T) {
	_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithJournalDir(t.TempDir()))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)

	srv := newPayServer(t)
	get := func() (reused bool) {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		resp, err := http.DefaultTransport.RoundTrip(req)
		require.NoError(t, err)
		readAll(t, resp)
		return reused
	}
	get() // leaves an idle connection in http.DefaultTransport's pool
	own, err := idemretry.NewTransport(nil, inMemory())
	require.NoError(t, err)
	resp, err := own.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	require.NoError(t, own.Close())
	assert.True(t, get(), "closing the Transport left http.DefaultTransport's connections alone")
}

func TestActionErrorMessage(t *testing.T) {
	keyed := &idemretry.ActionError{Action: "pay:1", Key: "k", Attempts: 6, Status: 503, Reason: idemretry.ErrAttemptsExhausted}
	assert.Equal(t, `idemretry: action "pay:1" (key k): 6 attempts, last status 503: attempts exhausted`, keyed.Error())
	unkeyed := &idemretry.ActionError{Attempts: 1, Err: errors.New("boom")}
	assert.Equal(t, "idemretry: 1 attempt: boom", unkeyed.Error())
}

// A base RoundTripper that breaks the contract by returning a response and
// an error: the error wins and the response body is closed.
func TestBaseReturningBothIsClosed(t *testing.T) {
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
