package idemretry_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// seen is one request as the test server received it.
type seen struct {
	Key      string
	BodyHash [32]byte
	Method   string
	Header   http.Header
}

// payServer is a loopback server with Stripe's idempotency semantics: a new
// key is processed once and its answer stored; a known key replays the
// stored answer with Idempotent-Replayed: true. script, if set, can answer a
// request itself (by its number, from 1) before the idempotency layer runs.
type payServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []seen
	stored   map[string]storedAnswer
	charges  int
	// script answers request n (1-based) itself when it returns true.
	script func(n int, w http.ResponseWriter, r *http.Request) bool
	// commitThenDrop: process the charge, store the answer, then cut the
	// connection without answering, for request numbers in this set.
	commitThenDrop map[int]bool
	// finalStatus is what a processed charge answers (default 201).
	finalStatus int
	// delay is how long a charge takes; a request with a key whose charge
	// is still in progress is answered 409, as Stripe does.
	delay    time.Duration
	inflight map[string]bool
	// arrived, if set, receives each request's number as it arrives.
	arrived chan int
}

type storedAnswer struct {
	status int
	body   string
}

func newPayServer(t *testing.T) *payServer {
	t.Helper()
	s := &payServer{stored: map[string]storedAnswer{}, commitThenDrop: map[int]bool{}, finalStatus: http.StatusCreated, inflight: map[string]bool{}}
	s.Server = newServer(t, s.serve)
	return s
}

// newSlowPayServer is newPayServer whose charges take delay, and which
// tells each request's number on arrived as it arrives.
func newSlowPayServer(t *testing.T, delay time.Duration) *payServer {
	t.Helper()
	s := newPayServer(t)
	s.delay, s.arrived = delay, make(chan int, 100)
	return s
}

func (s *payServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.requests = append(s.requests, seen{Key: key, BodyHash: sha256.Sum256(body), Method: r.Method, Header: r.Header.Clone()})
	n := len(s.requests)
	script, drop, arrived := s.script, s.commitThenDrop[n], s.arrived
	s.mu.Unlock()
	if arrived != nil {
		arrived <- n
	}

	if script != nil && script(n, w, r) {
		return
	}
	s.mu.Lock()
	if a, ok := s.stored[key]; ok && key != "" {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
		return
	}
	if s.inflight[key] && key != "" {
		s.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return
	}
	s.inflight[key] = true
	s.charges++
	a := storedAnswer{status: s.finalStatus, body: fmt.Sprintf(`{"charge":"ch_%d"}`, s.charges)}
	delay := s.delay
	s.mu.Unlock()
	time.Sleep(delay)
	s.mu.Lock()
	delete(s.inflight, key)
	if key != "" {
		s.stored[key] = a
	}
	s.mu.Unlock()
	if drop {
		hijackAndClose(w)
		return
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// newServer starts a loopback server that answers with h, closed when t
// ends.
func newServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// closedAddr is a loopback address nothing listens on: a dial to it is
// refused.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// hijackAndClose cuts the connection without an answer: to the client it
// looks exactly like a response lost on the way back.
func hijackAndClose(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func (s *payServer) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.requests...)
}

func (s *payServer) chargeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges
}

// leaderThenJoiners runs call n times, each on its own goroutine: the
// first alone until srv has its request (srv.arrived must be set), then
// the others, which join its flight. It returns when every call has.
func leaderThenJoiners(srv *payServer, n int, call func()) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call()
		}()
		if i == 0 {
			<-srv.arrived
		}
	}
	wg.Wait()
}

// requireOnePayment requires that the server saw n requests, all under one
// key, and charged once; it returns the requests.
func (s *payServer) requireOnePayment(t *testing.T, n int) []seen {
	t.Helper()
	reqs := s.seen()
	require.Len(t, reqs, n)
	require.Equal(t, slices.Repeat([]string{reqs[0].Key}, n), keysOf(reqs), "one key for every attempt")
	require.Equal(t, 1, s.chargeCount())
	return reqs
}

func keysOf(reqs []seen) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, r.Key)
	}
	return out
}

// status answers a fixed status, optionally with headers.
func status(code int, hdr ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, http.StatusText(code))
	}
}

// scriptFirst answers the first len(answers) requests with answers, and lets
// the idempotency layer answer the rest.
func scriptFirst(answers ...func(w http.ResponseWriter)) func(int, http.ResponseWriter, *http.Request) bool {
	return func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n <= len(answers) {
			answers[n-1](w)
			return true
		}
		return false
	}
}

// fakeClock is a Clock whose timers fire at once and advance Now by the time
// they were set for, recording every wait.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

func (c *fakeClock) NewTimer() idemretry.Timer { return &fakeTimer{c: c} }

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
}

func (t *fakeTimer) Start(d time.Duration) {
	t.c.mu.Lock()
	t.c.waits = append(t.c.waits, d)
	t.c.now = t.c.now.Add(d)
	now := t.c.now
	t.c.mu.Unlock()
	t.ch = make(chan time.Time, 1)
	t.ch <- now
}
func (t *fakeTimer) Stop()               {}
func (t *fakeTimer) C() <-chan time.Time { return t.ch }

// constant is a backoff that always waits d.
func constant(d time.Duration) func() backoff.BackOff {
	return func() backoff.BackOff { return backoff.NewConstantBackOff(d) }
}

// inMemory is the journal option of a Transport whose keys need not outlive
// it: a fresh in-memory journal.
func inMemory() idemretry.Option { return idemretry.WithJournal(journal.NewMemory()) }

// newTestTransport returns a Transport over an in-memory journal with a fake
// clock, and checks at cleanup that no goroutine of the package is left.
func newTestTransport(t *testing.T, opts ...idemretry.Option) (*idemretry.Transport, *journal.Memory, *fakeClock) {
	t.Helper()
	j := journal.NewMemory()
	tr, clk := newTestTransportOver(t, j, opts...)
	return tr, j, clk
}

// newTestTransportOver is newTestTransport over the journal j.
func newTestTransportOver(t *testing.T, j journal.Journal, opts ...idemretry.Option) (*idemretry.Transport, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	base := &http.Transport{}
	all := append([]idemretry.Option{idemretry.WithJournal(j), idemretry.WithClock(clk)}, opts...)
	tr, err := idemretry.NewTransport(base, all...)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, tr.Close())
		base.CloseIdleConnections()
		checkNoPackageGoroutines(t)
	})
	return tr, clk
}

// roundTrip sends req through tr and requires a response, whose body it
// reads and closes.
func roundTrip(t *testing.T, tr http.RoundTripper, req *http.Request) *http.Response {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	readAll(t, resp)
	return resp
}

// sendErr sends req through tr, closes the response if there is one, and
// returns the error.
func sendErr(tr http.RoundTripper, req *http.Request) error {
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// transportOver returns a Transport over j on the real clock, with its own
// HTTP connections, closed when t ends.
func transportOver(t *testing.T, j journal.Journal, opts ...idemretry.Option) *idemretry.Transport {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := idemretry.NewTransport(base, append([]idemretry.Option{idemretry.WithJournal(j)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// retryTwiceOver returns a Transport over base and a fresh in-memory journal
// that retries twice, a millisecond apart, closed when t ends, and a context
// that ends after 20 s or when t ends.
func retryTwiceOver(t *testing.T, base http.RoundTripper) (*idemretry.Transport, context.Context) {
	t.Helper()
	tr, err := idemretry.NewTransport(base, inMemory(),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return tr, ctx
}

// stallBody answers with status and a body that stops after prefix, short
// of its declared length, until release is closed or the request ends; it
// reports whether the request ended first.
func stallBody(w http.ResponseWriter, r *http.Request, status int, prefix string, release <-chan struct{}) bool {
	w.Header().Set("Content-Length", "100000")
	w.WriteHeader(status)
	io.WriteString(w, prefix)
	w.(http.Flusher).Flush()
	select {
	case <-release:
		return false
	case <-r.Context().Done():
		return true
	}
}

// checkNoPackageGoroutines fails if a goroutine running the package's code
// (other than tests) is still alive: RoundTrip must not leave any behind.
func checkNoPackageGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var leaked []string
		for _, g := range strings.Split(goroutineStacks(), "\n\n") {
			if strings.Contains(g, "github.com/idemretry/idemretry.") &&
				!strings.Contains(g, "_test.") && !strings.Contains(g, "testing.tRunner") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left behind:\n%s", strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// goroutineStacks is the stack dump of every goroutine, one paragraph each.
func goroutineStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// onlyReader hides every method but Read, so net/http cannot rewind it.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// closeTracker records whether a body was closed.
type closeTracker struct {
	io.Reader
	mu     sync.Mutex
	closed bool
}

func (c *closeTracker) Close() error { c.mu.Lock(); c.closed = true; c.mu.Unlock(); return nil }
func (c *closeTracker) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// rtFunc adapts a function to http.RoundTripper.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func resp(code int, req *http.Request) *http.Response {
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("x")), Request: req}
}

func httptestGet(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}

// watchedOpenAttempts sends 10 actions named prefix-i through tr to url,
// each answered 201 with a body larger than a connection buffers, keeps
// their responses open (closed when t ends), and returns how many
// goroutines of the context package watch a context then: an attempt's,
// or one derived from it, that the context package could not link.
func watchedOpenAttempts(t *testing.T, tr http.RoundTripper, url, prefix string) int {
	t.Helper()
	for i := range 10 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("%s-%d", prefix, i)), url, `{"amount":1}`))
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	return strings.Count(goroutineStacks(), "created by context.(*cancelCtx).propagateCancel")
}

// newOpenBodyServer answers each request 201 with a 256 KiB body, more
// than a loopback connection buffers: a response not read stays open, its
// request's context alive. It is closed when t ends.
func newOpenBodyServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("x", 256<<10))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// leftPending sends req once through a Transport over j whose answer is
// lost (the server's doing), and closes that Transport: the "crash" that
// leaves req's action pending in j. opts are added to the Transport's.
func leftPending(t *testing.T, j journal.Journal, req *http.Request, opts ...idemretry.Option) {
	t.Helper()
	first, err := idemretry.NewTransport(&http.Transport{}, append([]idemretry.Option{idemretry.WithJournal(j), idemretry.WithMaxRetries(0)}, opts...)...)
	require.NoError(t, err)
	_, err = first.RoundTrip(req)
	require.Error(t, err, "the first answer is lost")
	require.NoError(t, first.Close())
}

// sendAsync sends req through tr on a goroutine of its own, reads and
// closes the response if there is one, and gives the error on the channel
// it returns: a live request of the app's, sent while the test goes on.
func sendAsync(tr http.RoundTripper, req *http.Request) <-chan error {
	done := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	return done
}

// resumed is what a Resume returned.
type resumed struct {
	res []idemretry.ResumeResult
	err error
}

// resumeAsync runs tr.Resume with r while the test goes on, and sends what
// it returned on the channel.
func resumeAsync(ctx context.Context, tr *idemretry.Transport, r idemretry.Resumer, concurrency int) <-chan resumed {
	done := make(chan resumed, 1)
	go func() {
		res, err := tr.Resume(ctx, r, concurrency)
		done <- resumed{res, err}
	}()
	return done
}

// payAgain is the app paying again, through tr, each action in ids (those
// Resolve was told had no charge), with body.
func payAgain(t *testing.T, tr http.RoundTripper, ctx context.Context, url, body string, ids []string) {
	t.Helper()
	for _, id := range ids {
		if resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, id), url, body)); err == nil {
			readAll(t, resp)
		}
	}
}

// slowFirstCharge makes srv hold its first request, as a slow provider
// does, until unblock (or the test's end); arrived is closed when it is
// there. The charge is made once it is released.
func slowFirstCharge(t *testing.T, srv *payServer) (arrived <-chan struct{}, unblock func()) {
	in, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock = func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	srv.script = func(n int, _ http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			close(in)
			<-release
		}
		return false
	}
	return in, unblock
}
