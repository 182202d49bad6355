package idemretry_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// TestMain runs the tests that call t.Parallel up to 8 at a time, more
// than there are cores: they wait (on loopback servers, timers, journals
// that hang, child processes) far more than they compute. A -parallel
// given on the command line wins, and fuzzing keeps its own default.
// The tests that read or change what the whole process holds (its
// goroutines, newTestTransport's check at cleanup included; the heap and
// allocation counts; crypto/rand.Reader; the environment and working
// directory) do not call t.Parallel: they run one at a time, before the
// parallel ones start.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if fuzz := flag.Lookup("test.fuzz"); !given && (fuzz == nil || fuzz.Value.String() == "") {
		_ = flag.Set("test.parallel", strconv.Itoa(max(8, runtime.GOMAXPROCS(0))))
	}
	os.Exit(m.Run())
}

// seen is one request as the test server received it.
type seen struct {
	Key      string // the Idempotency-Key header as sent
	BodyHash [32]byte
	Method   string
	Header   http.Header
}

// payServer is the shared payment server (internal/paytest: Stripe's
// idempotency semantics and a ledger) on loopback, with the hooks the
// tests set after it started. It charges every method of net/http's and keyless
// requests too (each time), and answers a charge {"charge":"ch_N"}.
// script, if set, can answer a request itself (by its number, from 1)
// before the idempotency layer runs. Set the hooks before the requests
// they shape are sent, or under mu.
type payServer struct {
	*httptest.Server
	pay *paytest.Server
	mu  sync.Mutex
	// script answers request n (1-based) itself when it returns true.
	script func(n int, w http.ResponseWriter, r *http.Request) bool
	// commitThenDrop: process the charge, store the answer, then cut the
	// connection without answering, for request numbers in this set.
	commitThenDrop map[int]bool
	// afterCharge, if set, is called once request n's charge is stored and
	// answers it itself when it returns true (after commitThenDrop).
	afterCharge func(n int, w http.ResponseWriter, r *http.Request) bool
	// delay is how long a charge takes; a request with a key whose charge
	// is still in progress is answered 409, as Stripe does.
	delay time.Duration
	// arrived, if set, receives each request's number as it arrives.
	arrived chan int
	busy    int           // charges in progress (in their delay)
	skew    time.Duration // added to the server's clock: see forgetKeys
}

func newPayServer(t *testing.T) *payServer {
	t.Helper()
	s := &payServer{commitThenDrop: map[int]bool{}}
	s.pay = paytest.New(
		paytest.WithKeylessCharges(),
		paytest.WithMethods(http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
			http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace),
		paytest.WithAnswerBody(func(c paytest.Charge) []byte { return []byte(`{"charge":"` + c.ID + `"}`) }),
		paytest.WithClock(func() time.Time {
			s.mu.Lock()
			defer s.mu.Unlock()
			return time.Now().Add(s.skew)
		}),
		paytest.WithBefore(func(n int, w http.ResponseWriter, r *http.Request) bool {
			s.mu.Lock()
			script, arrived := s.script, s.arrived
			s.mu.Unlock()
			if arrived != nil {
				arrived <- n
			}
			return script != nil && script(n, w, r)
		}),
		paytest.WithProcessing(func(int, *http.Request) {
			s.mu.Lock()
			delay := s.delay
			s.busy++
			s.mu.Unlock()
			time.Sleep(delay)
			s.mu.Lock()
			s.busy--
			s.mu.Unlock()
		}),
		paytest.WithAfterCharge(func(n int, w http.ResponseWriter, r *http.Request) bool {
			s.mu.Lock()
			drop, after := s.commitThenDrop[n], s.afterCharge
			s.mu.Unlock()
			if drop {
				hijackAndClose(w)
				return true
			}
			return after != nil && after(n, w, r)
		}))
	s.Server = newServer(t, s.pay.ServeHTTP)
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

// forgetKeys makes the server forget every key whose charge is done, as
// if its key window had passed: a request with one is charged again.
func (s *payServer) forgetKeys() {
	s.mu.Lock()
	s.skew += paytest.DefaultKeyWindow
	s.mu.Unlock()
}

// charging reports whether a charge is in progress (in its delay).
func (s *payServer) charging() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy > 0
}

// charged reports whether the server charged under key.
func (s *payServer) charged(key string) bool { return len(s.pay.ChargesUnder(key)) > 0 }

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
	var out []seen
	for _, r := range s.pay.Requests() {
		out = append(out, seen{Key: r.Header.Get(paytest.KeyHeader), BodyHash: sha256.Sum256(r.Body), Method: r.Method, Header: r.Header})
	}
	return out
}

func (s *payServer) chargeCount() int { return len(s.pay.Charges()) }

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

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("no entropy") }

// liveness bounds how long a test waits for a RoundTrip that must end
// because its caller cancelled: it fails the test, it measures nothing.
const liveness = 30 * time.Second

// awaitJoiners waits until n callers have joined flights of tr (bounded by
// 10 s), so that what a test does next happens while they wait.
func awaitJoiners(t *testing.T, tr *idemretry.Transport, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return idemretry.FlightJoiners(tr) >= n }, 10*time.Second, time.Millisecond,
		"%d caller(s) joined a flight", n)
}

// holdRequest makes srv hold its request number n, once it has arrived
// (told on the channel returned), until release is called (or the test
// ends); then the idempotency layer answers it as usual.
func holdRequest(t *testing.T, srv *payServer, n int) (arrived <-chan struct{}, release func()) {
	in, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	srv.script = func(m int, _ http.ResponseWriter, _ *http.Request) bool {
		if m == n {
			close(in)
			<-gate
		}
		return false
	}
	return in, release
}

// payAsync sends req through tr on its own goroutine; the channel gives
// its status, body and whether it was a replay.
func payAsync(tr http.RoundTripper, req *http.Request) <-chan paid {
	out := make(chan paid, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			out <- paid{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- paid{status: resp.StatusCode, body: string(b), replay: idemretry.IsReplay(resp), err: err}
	}()
	return out
}

type paid struct {
	status int
	body   string
	replay bool
	err    error
}

// answer writes a status with headers (name, value pairs) and a body.
func answer(code int, body string, hdr ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
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

// maxRand always draws the top of the range, to show each ceiling.
type maxRand struct{}

func (maxRand) Int64N(n int64) int64 { return n - 1 }

// wantPrefixOnce checks that err's message carries "idemretry:" once.
func wantPrefixOnce(t *testing.T, err error) {
	t.Helper()
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry:"), "%q", err.Error())
}

// flakyJournal wraps a Memory: its Updates to done fail while failDone
// is set, and hang (until their context ends) while hang is set.
type flakyJournal struct {
	*journal.Memory
	failDone, hang atomic.Bool
}

var errDiskGone = errors.New("test: storage unavailable")

func (f *flakyJournal) Update(ctx context.Context, rec journal.Record) error {
	if f.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.failDone.Load() && rec.State == journal.StateDone {
		return errDiskGone
	}
	return f.Memory.Update(ctx, rec)
}

// appResumer rebuilds requests from what the app itself keeps (its orders),
// and resolves unknown actions by asking the "provider".
type appResumer struct {
	url      string
	orders   map[string]string // action id or key -> body
	unnamed  []string          // bodies of payments sent without a name
	mu       sync.Mutex
	resolved []string
}

func (a *appResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	body, ok := a.orders[rec.ActionID]
	if !ok {
		body, ok = a.orders[rec.Key]
	}
	if !ok && strings.HasPrefix(rec.ActionID, "fp:") && len(a.unnamed) > 0 {
		body, ok = a.unnamed[0], true // the app resends its one unnamed payment
	}
	if !ok {
		return nil, errors.New("unknown order")
	}
	return http.NewRequestWithContext(ctx, http.MethodPost, a.url, strings.NewReader(body))
}

func (a *appResumer) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	a.mu.Lock()
	a.resolved = append(a.resolved, rec.Key)
	a.mu.Unlock()
	return true, nil
}

func uuidCheck(s string) error {
	if len(s) != 36 || s[14] != '4' {
		return errors.New("not a UUIDv4: " + s)
	}
	return nil
}

// stringsReader is a strings.Reader without its other methods, so the
// request is buffered by the Transport like any streamed body.
func stringsReader(s string) io.Reader { return onlyReader{strings.NewReader(s)} }

// pausingJournal is a journal.Memory whose Reserve can be held: before
// (if set) runs before the inner Reserve of want, after (if set) once it
// returned. Each hook is taken (cleared) as it runs. It stands for a
// journal shared by two processes (sqljournal), whose calls interleave.
type pausingJournal struct {
	journal.Journal
	mu            sync.Mutex
	before, after func(want, got journal.Record, created bool)
}

func (p *pausingJournal) Reserve(ctx context.Context, want journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	p.mu.Lock()
	before := p.before
	if before != nil && want.ActionID == "pay:A" {
		p.before = nil
	} else {
		before = nil
	}
	p.mu.Unlock()
	if before != nil {
		before(want, journal.Record{}, false)
	}
	got, created, err := p.Journal.Reserve(ctx, want, mode)
	p.mu.Lock()
	after := p.after
	if after != nil && want.ActionID == "pay:A" {
		p.after = nil
	} else {
		after = nil
	}
	p.mu.Unlock()
	if after != nil && err == nil {
		after(want, got, created)
	}
	return got, created, err
}

// pendingPayA leaves pay:A pending in j under a key the server never
// processed (the connection was cut before it was), and returns its
// record; srv answers normally after.
func pendingPayA(t *testing.T, srv *payServer, j journal.Journal, body string) journal.Record {
	t.Helper()
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			hijackAndClose(w) // lost before it was processed
			return true
		}
		return false
	}
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, body))
	srv.mu.Lock()
	srv.script = nil
	srv.mu.Unlock()
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	return recs[0]
}

// slowProgressJournal is a Memory journal whose Update of a pending record
// (the attempt count written before the first retry's wait) hangs until
// its context ends.
type slowProgressJournal struct {
	*journal.Memory
	progress atomic.Int32
}

func (j *slowProgressJournal) Update(ctx context.Context, rec journal.Record) error {
	if rec.State == journal.StatePending {
		j.progress.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	return j.Memory.Update(ctx, rec)
}

// detachedContext is the context an app detaches from a request's with
// its own type (as before context.WithoutCancel, e.g. x/tools' xcontext):
// it never ends and has no deadline, but its values, all of them, are its
// parent's.
type detachedContext struct{ parent context.Context }

func (detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detachedContext) Done() <-chan struct{}       { return nil }
func (detachedContext) Err() error                  { return nil }
func (d detachedContext) Value(k any) any           { return d.parent.Value(k) }

// noDoneContext reports a fixed deadline and no Done channel; its Err is
// Background's (nil): a Done that never closes has nothing to report.
type noDoneContext struct {
	context.Context
	dl time.Time
}

func (c noDoneContext) Deadline() (time.Time, bool) { return c.dl, true }
func (noDoneContext) Done() <-chan struct{}         { return nil }

// gatedResumer rebuilds one body for every record, on Resume's ctx; before
// returning the request it says so on rebuilding (if set) and waits for
// gate (if set): an app whose Rebuild reads its own records, slowly.
type gatedResumer struct {
	url, method, body string
	rebuilding        chan journal.Record
	gate              chan struct{}
	rebuilt           atomic.Int32
}

func (g *gatedResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	g.rebuilt.Add(1)
	if g.rebuilding != nil {
		g.rebuilding <- rec
	}
	if g.gate != nil {
		<-g.gate
	}
	method := g.method
	if method == "" {
		method = http.MethodPost
	}
	return http.NewRequestWithContext(ctx, method, g.url, strings.NewReader(g.body))
}

func (g *gatedResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }
