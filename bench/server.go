package bench

import (
	"bytes"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
)

// ActionHeader names the logical action of a request for the test server, so
// that the flaky server can fail the first attempt of each action whatever
// client sent it: the peers send no Idempotency-Key to tell actions apart.
const ActionHeader = "X-Bench-Action"

// Server is a loopback HTTP server that reads every request body in full and
// answers 201 Created. When Flaky, it answers 503 (with a small body, as real
// servers do) to the first attempt of each action and 201 to the second.
// It counts what a benchmark or test needs to know was right.
type Server struct {
	*httptest.Server
	wantLen int64
	flaky   bool

	conns     atomic.Int64 // connections accepted: a client that leaks responses dials more
	requests  atomic.Int64
	keyed     atomic.Int64 // requests that carried an Idempotency-Key
	badBodies atomic.Int64 // bodies that were not payload(wantLen)

	verify bool // compare every body with payload(wantLen), not only its length

	// seen, when not nil, holds every Idempotency-Key received and how many
	// requests carried it: for tests (NewRecordingServer); benchmarks do not
	// pay for it.
	seenMu sync.Mutex
	seen   map[string]int

	mu   sync.Mutex
	keys map[string]string // flaky: action -> Idempotency-Key of its first attempt
	// keyMismatch counts second attempts whose key differed from the first's.
	keyMismatch atomic.Int64
}

// NewServer starts a Server expecting bodies of wantLen bytes.
func NewServer(wantLen int64, flaky bool) *Server { return newServer(wantLen, flaky, false) }

// NewCheckingServer is NewServer that also compares every body with the
// payload byte for byte: for tests; benchmarks do not pay for it.
func NewCheckingServer(wantLen int64, flaky bool) *Server { return newServer(wantLen, flaky, true) }

// NewRecordingServer is NewServer that also remembers every Idempotency-Key
// it receives (see Keys): for tests.
func NewRecordingServer(wantLen int64) *Server {
	s := newServer(wantLen, false, false)
	s.seen = make(map[string]int)
	return s
}

func newServer(wantLen int64, flaky, verify bool) *Server {
	s := &Server{wantLen: wantLen, flaky: flaky, verify: verify, keys: make(map[string]string)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	return s
}

var (
	created     = []byte(`{"id":"ch_1","status":"succeeded"}`)
	unavailable = []byte(`{"error":"temporarily unavailable"}`)
)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		s.keyed.Add(1)
		if s.seen != nil {
			s.seenMu.Lock()
			s.seen[k]++
			s.seenMu.Unlock()
		}
	}
	var sink io.Writer = io.Discard
	var cmp *comparer
	if s.verify {
		cmp = &comparer{want: payload(s.wantLen)}
		sink = cmp
	}
	n, _ := io.Copy(sink, r.Body)
	if n != s.wantLen || (cmp != nil && cmp.diff) {
		s.badBodies.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if s.flaky && s.firstAttempt(r) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write(unavailable)
		return
	}
	w.WriteHeader(http.StatusCreated)
	w.Write(created)
}

// firstAttempt reports whether r is the first attempt of its action and
// remembers it until the second, checking that both carry the same key.
func (s *Server) firstAttempt(r *http.Request) bool {
	action, key := r.Header.Get(ActionHeader), r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	first, seen := s.keys[action]
	if !seen {
		s.keys[action] = key
		return true
	}
	delete(s.keys, action) // keeps the map small over millions of actions
	if first != key {
		s.keyMismatch.Add(1)
	}
	return false
}

// comparer checks a stream against want without holding the stream.
type comparer struct {
	want []byte
	off  int
	diff bool
}

func (c *comparer) Write(p []byte) (int, error) {
	if c.off+len(p) > len(c.want) || !bytes.Equal(p, c.want[c.off:c.off+len(p)]) {
		c.diff = true
	}
	c.off += len(p)
	return len(p), nil
}

// Keyed returns how many requests carried an Idempotency-Key.
func (s *Server) Keyed() int64 { return s.keyed.Load() }

// Keys returns how many requests carried each Idempotency-Key, for a
// server made by NewRecordingServer (nil otherwise).
func (s *Server) Keys() map[string]int {
	if s.seen == nil {
		return nil
	}
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	return maps.Clone(s.seen)
}

// Conns returns how many connections the server has accepted.
func (s *Server) Conns() int64 { return s.conns.Load() }

// Requests returns how many requests the server has answered.
func (s *Server) Requests() int64 { return s.requests.Load() }

// BadBodies returns how many request bodies arrived with the wrong length.
func (s *Server) BadBodies() int64 { return s.badBodies.Load() }

// KeyMismatches returns how many retried actions changed key between attempts.
func (s *Server) KeyMismatches() int64 { return s.keyMismatch.Load() }
