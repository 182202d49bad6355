package interop

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// wire is a loopback server that records every request (its key, under
// the header it is told) and answers it with answer, given the request's
// number from 1.
type wire struct {
	*httptest.Server
	header string
	mu     sync.Mutex
	keys   []string
	bodies []string
	answer func(n int, w http.ResponseWriter, r *http.Request)
}

func newWire(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *wire {
	t.Helper()
	s := &wire{header: "Idempotency-Key", answer: answer}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get(s.header))
		s.bodies = append(s.bodies, string(b))
		n := len(s.keys)
		s.mu.Unlock()
		s.answer(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// requests returns how many requests the server saw.
func (s *wire) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// seenKeys returns the key of every request, in order ("" for none).
func (s *wire) seenKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// always answers every request with status, the headers (name, value
// pairs) and body.
func always(status int, body string, hdr ...string) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) { write(w, status, body, hdr...) }
}

func write(w http.ResponseWriter, status int, body string, hdr ...string) {
	for i := 0; i+1 < len(hdr); i += 2 {
		w.Header().Set(hdr[i], hdr[i+1])
	}
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// instantClock is an idemretry.Clock whose timers fire at once, recording
// the wait each was set for, so that the tests measure idemretry's waits
// without sleeping through them.
type instantClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
}

func newInstantClock() *instantClock { return &instantClock{now: time.Now()} }

func (c *instantClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *instantClock) NewTimer() idemretry.Timer { return &instantTimer{c: c} }

// Waits returns every wait a timer was started for, in order.
func (c *instantClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

type instantTimer struct {
	c  *instantClock
	ch chan time.Time
}

func (t *instantTimer) Start(d time.Duration) {
	t.c.mu.Lock()
	t.c.waits = append(t.c.waits, d)
	t.c.now = t.c.now.Add(d)
	now := t.c.now
	t.c.mu.Unlock()
	t.ch = make(chan time.Time, 1)
	t.ch <- now
}

func (t *instantTimer) Stop()               {}
func (t *instantTimer) C() <-chan time.Time { return t.ch }

// noWait is a BackOff that draws no wait: a Retry-After alone makes one.
func noWait() backoff.BackOff { return &backoff.ZeroBackOff{} }

// newTransport returns an idemretry Transport over base (its own
// connections if nil) and an in-memory journal, on an instant clock, with
// opts after those; it is closed when t ends.
func newTransport(t *testing.T, base http.RoundTripper, opts ...idemretry.Option) (*idemretry.Transport, *instantClock) {
	t.Helper()
	clk := newInstantClock()
	if base == nil {
		own := &http.Transport{}
		t.Cleanup(own.CloseIdleConnections)
		base = own
	}
	all := append([]idemretry.Option{idemretry.WithJournal(journal.NewMemory()), idemretry.WithClock(clk)}, opts...)
	tr, err := idemretry.NewTransport(base, all...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	return tr, clk
}

// Child processes: a test re-runs this test binary with -test.run naming
// one of its Child tests and the environment below; a Child test does
// nothing unless envChild names it.
const (
	envChild = "IDEMRETRY_INTEROP_CHILD" // the Child test to run
	envURL   = "IDEMRETRY_INTEROP_URL"   // the server the child sends to
	envDir   = "IDEMRETRY_INTEROP_DIR"   // the child's journal directory
)

// childOnly skips the calling Child test unless this process is that child.
func childOnly(t *testing.T, name string) {
	t.Helper()
	if os.Getenv(envChild) != name {
		t.Skip("child process of another test")
	}
}

// startChild starts this test binary running the Child test name with the
// server url and the journal directory dir. Its output goes to the test's
// log when it ends.
func startChild(t *testing.T, name, url, dir string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envChild+"="+name, envURL+"="+url, envDir+"="+dir)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	return cmd, out
}

// hijackAndClose cuts the connection without an answer; with reset it
// sends a TCP RST instead of a FIN.
func hijackAndClose(w http.ResponseWriter, reset bool) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

// post is a POST of body to url with ctx.
func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	return req
}

// bg is a context for calls that need none of their own.
var bg = context.Background()

// ledgerServer is the shared payment server (internal/paytest: Stripe's
// idempotency semantics over a ledger) on loopback: a new key is charged
// once and its answer (200, created's body) stored; a known key gets the
// stored answer with Idempotent-Replayed: true; a request without a key
// is charged every time.
type ledgerServer struct {
	*httptest.Server
	pay *paytest.Server
	mu  sync.Mutex
	// before, if set (faults), may answer request n itself, before the
	// ledger sees it: a fault before the charge.
	before func(n int, w http.ResponseWriter, r *http.Request) bool
	// after, if set, may replace the answer to request n once it was
	// charged: a fault after the charge.
	after func(n int, w http.ResponseWriter, r *http.Request) bool
}

// newLedgerServer returns a ledgerServer whose charge number c (from 1)
// answers created(c).
func newLedgerServer(t *testing.T, created func(c int) string) *ledgerServer {
	t.Helper()
	s := &ledgerServer{}
	charges := 0 // WithAnswerBody is called once per charge, in order, under the server's lock
	s.pay = paytest.New(
		paytest.WithMethods(http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
			http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace),
		paytest.WithKeylessCharges(), paytest.WithStatus(http.StatusOK),
		paytest.WithAnswerBody(func(paytest.Charge) []byte { charges++; return []byte(created(charges)) }),
		paytest.WithBefore(func(n int, w http.ResponseWriter, r *http.Request) bool {
			s.mu.Lock()
			before := s.before
			s.mu.Unlock()
			return before != nil && before(n, w, r)
		}),
		paytest.WithAfterCharge(func(n int, w http.ResponseWriter, r *http.Request) bool {
			s.mu.Lock()
			after := s.after
			s.mu.Unlock()
			return after != nil && after(n, w, r)
		}))
	s.Server = httptest.NewServer(s.pay)
	t.Cleanup(s.Close)
	return s
}

// faults sets before and after (either may be nil).
func (s *ledgerServer) faults(before, after func(n int, w http.ResponseWriter, r *http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before, s.after = before, after
}

func (s *ledgerServer) chargeCount() int { return len(s.pay.Charges()) }

// seenKeys returns the key of every request, in order ("" for none).
func (s *ledgerServer) seenKeys() []string {
	var out []string
	for _, r := range s.pay.Requests() {
		out = append(out, r.Header.Get(paytest.KeyHeader))
	}
	return out
}
