// Package paytest is a payment server for tests: an http.Handler with
// Stripe's idempotency semantics and a ledger of what it charged, usable
// over httptest (real loopback HTTP) or called in memory.
//
// A POST or PATCH (WithMethods) with an Idempotency-Key (bare, as Stripe sends it, or
// quoted, as the IETF draft does) is charged once: its answer is stored
// and replayed, with Idempotent-Replayed: true, to every later request with
// the same key. While the first request of a key is being processed, another
// one gets 409 (Stripe's idempotency_key_in_use); a request with the key and
// another method, path or body gets 422 (the IETF draft's "Idempotency-Key
// is already used"), and nothing is charged. A key is forgotten once the
// server's key window (WithKeyWindow, 24 hours by default) has passed since
// its first request: a request with it is then a new charge, as Stripe's
// pruned keys are. A keyed method without a key is refused with 400, or,
// with WithKeylessCharges, charged every time, as a server without
// idempotency would.
//
// The ledger records every charge with its key and intent, and every
// request with what the server did with it. The intent of a request is the
// value of its IntentHeader if it has one, else its body: a test names the
// thing the user meant to do once, and counts the charges of it.
//
// A charge's answer is 201 (WithStatus) with a JSON body (WithAnswerBody
// sets another):
//
//	{"charge":"ch_1","intent":"order-7","key":"8e03978e-..."}
//
// Hooks let a test shape the answers: WithBefore answers a request itself
// before the idempotency layer (a 503, a scripted reply); WithProcessing is
// called while a key is in flight, before its charge is stored (block there
// for a slow charge: requests of the key meanwhile get 409); WithFailure
// may then fail the charge (a 503: nothing stored, the key released);
// WithAfterCharge is called after the charge is stored and before its answer is written
// (HijackAndClose there loses the answer on the way back).
package paytest

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// IntentHeader names the thing the user meant to do once, for the ledger.
// A request without it is counted under its body.
const IntentHeader = "Paytest-Intent"

// KeyHeader is the header the server reads the key from.
const KeyHeader = "Idempotency-Key"

// DefaultKeyWindow is how long the server remembers a key: Stripe prunes
// keys once they are at least 24 hours old.
const DefaultKeyWindow = 24 * time.Hour

// Outcome is what the server did with a request.
type Outcome uint8

const (
	// Charged: a new key (or a keyless charge): the charge was made and its
	// answer stored.
	Charged Outcome = iota + 1
	// Replayed: a known key: the stored answer was sent again.
	Replayed
	// InFlight: the key's first request was still being processed: 409.
	InFlight
	// Mismatch: the key was used with another method, path or body: 422.
	Mismatch
	// NoKey: a keyed method without a key, refused with 400.
	NoKey
	// Answered: a WithBefore hook answered the request itself.
	Answered
	// NotAllowed: a method the server does not charge: 405.
	NotAllowed
	// Failed: a WithFailure hook failed the charge: nothing was charged
	// or stored, and the key was released.
	Failed
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Charged:
		return "charged"
	case Replayed:
		return "replayed"
	case InFlight:
		return "in-flight"
	case Mismatch:
		return "mismatch"
	case NoKey:
		return "no-key"
	case Answered:
		return "answered"
	case NotAllowed:
		return "not-allowed"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// A Charge is one charge the server made.
type Charge struct {
	ID     string // "ch_1", "ch_2", ... in the order made
	Key    string // bare; "" for a keyless charge
	Intent string
	Body   []byte
	Header http.Header // the charging request's
	At     time.Time   // by the server's clock
}

// A Request is one request the server received, and what it did with it.
type Request struct {
	N       int // 1, 2, ... in the order received
	Method  string
	Path    string
	Key     string // bare, or ""
	Intent  string
	Body    []byte
	Header  http.Header
	At      time.Time
	Outcome Outcome // 0 while it is being processed
	Status  int
	Charge  string // the charge made or replayed, or ""
}

// Answer is the JSON body of a charge's answer.
type Answer struct {
	Charge string `json:"charge"`
	Intent string `json:"intent"`
	Key    string `json:"key"`
}

// An Option configures a Server.
type Option func(*Server)

// WithClock sets the clock the key window and the ledger's times are read
// from (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithKeyWindow sets how long the server remembers a key after its first
// request (default DefaultKeyWindow).
func WithKeyWindow(d time.Duration) Option { return func(s *Server) { s.window = d } }

// WithStatus sets the status of a charge's answer (default 201).
func WithStatus(code int) Option { return func(s *Server) { s.status = code } }

// WithMethods sets the methods the server charges (default POST and
// PATCH); a request of another method is refused with 405.
func WithMethods(methods ...string) Option {
	return func(s *Server) { s.methods = append([]string(nil), methods...) }
}

// WithAnswerBody sets the body of a charge's answer: f is called once per
// charge, under the server's lock, and what it returns is stored and
// replayed. By default it is the charge's Answer as JSON.
func WithAnswerBody(f func(c Charge) []byte) Option { return func(s *Server) { s.answerBody = f } }

// WithKeylessCharges makes the server charge a keyed method that carries no
// key, every time, as a server without idempotency would (by default it is
// refused with 400).
func WithKeylessCharges() Option { return func(s *Server) { s.keyless = true } }

// WithBefore calls f with each request's number (from 1) before the
// idempotency layer; if f returns true it has answered the request, which
// is logged as Answered and charges nothing.
func WithBefore(f func(n int, w http.ResponseWriter, r *http.Request) bool) Option {
	return func(s *Server) { s.before = f }
}

// WithProcessing calls f while a new key is in flight, after it is claimed
// and before its charge is stored: a request with the key that arrives
// meanwhile gets 409. f may block (a slow charge).
func WithProcessing(f func(n int, r *http.Request)) Option {
	return func(s *Server) { s.processing = f }
}

// WithFailure calls f after WithProcessing's hook, while the key is still
// in flight; if f returns a status, the charge fails with it: nothing is
// charged or stored, the key is released (its next request is a new one:
// Stripe stores no answer for a request that failed before it began
// executing) and the request is answered status.
func WithFailure(f func(n int, r *http.Request) (status int, failed bool)) Option {
	return func(s *Server) { s.failure = f }
}

// WithAfterCharge calls f after a charge is stored and before its answer is
// written; if f returns true it has answered (or cut the connection, see
// HijackAndClose) instead. The charge stands either way.
func WithAfterCharge(f func(n int, w http.ResponseWriter, r *http.Request) bool) Option {
	return func(s *Server) { s.afterCharge = f }
}

// Server is the payment server. Its zero value is not usable; make one with
// New. It is safe for concurrent use.
type Server struct {
	now         func() time.Time
	window      time.Duration
	status      int
	keyless     bool
	methods     []string
	answerBody  func(c Charge) []byte
	before      func(n int, w http.ResponseWriter, r *http.Request) bool
	processing  func(n int, r *http.Request)
	failure     func(n int, r *http.Request) (int, bool)
	afterCharge func(n int, w http.ResponseWriter, r *http.Request) bool

	mu       sync.Mutex
	keys     map[string]*stored
	charges  []Charge
	requests []Request
}

// stored is what the server keeps per key.
type stored struct {
	fingerprint [32]byte
	first       time.Time
	done        bool // the answer is stored; false while in flight
	status      int
	body        []byte
	charge      string
}

// New returns a Server.
func New(opts ...Option) *Server {
	s := &Server{now: time.Now, window: DefaultKeyWindow, status: http.StatusCreated, keys: make(map[string]*stored),
		methods: []string{http.MethodPost, http.MethodPatch}}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// A body cut on the way in is no request: nothing is charged.
		http.Error(w, "paytest: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	key := bareKey(r.Header.Get(KeyHeader))
	intent := r.Header.Get(IntentHeader)
	if intent == "" {
		intent = string(body)
	}
	s.mu.Lock()
	n := len(s.requests) + 1
	s.requests = append(s.requests, Request{N: n, Method: r.Method, Path: r.URL.Path, Key: key, Intent: intent,
		Body: body, Header: r.Header.Clone(), At: s.now()})
	before := s.before
	s.mu.Unlock()
	if before != nil && before(n, w, r) {
		s.settle(n, Answered, 0, "")
		return
	}
	if !slices.Contains(s.methods, r.Method) {
		s.settle(n, NotAllowed, http.StatusMethodNotAllowed, "")
		writeJSON(w, http.StatusMethodNotAllowed, `{"error":{"type":"invalid_request_error","message":"this method is not charged"}}`, nil)
		return
	}
	fp := sha256.Sum256(append([]byte(r.Method+"\x00"+r.URL.Path+"\x00"), body...))
	if key == "" {
		if !s.keyless {
			s.settle(n, NoKey, http.StatusBadRequest, "")
			writeJSON(w, http.StatusBadRequest, `{"error":{"type":"invalid_request_error","message":"an Idempotency-Key header is required"}}`, nil)
			return
		}
		s.charge(n, w, r, "", intent, body, nil)
		return
	}
	s.mu.Lock()
	now := s.now()
	st, ok := s.keys[key]
	if ok && st.done && !now.Before(st.first.Add(s.window)) {
		delete(s.keys, key) // forgotten: the server's key window is over
		ok = false
	}
	switch {
	case ok && st.fingerprint != fp:
		s.mu.Unlock()
		s.settle(n, Mismatch, http.StatusUnprocessableEntity, "")
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, `{"type":"https://developer.example.com/idempotency","title":"Idempotency-Key is already used","detail":"this key was used with another request"}`)
		return
	case ok && !st.done:
		s.mu.Unlock()
		s.settle(n, InFlight, http.StatusConflict, "")
		writeJSON(w, http.StatusConflict, `{"error":{"type":"invalid_request_error","code":"idempotency_key_in_use","message":"a request with this key is in progress"}}`, nil)
		return
	case ok:
		status, answer, charge := st.status, st.body, st.charge
		s.mu.Unlock()
		s.settle(n, Replayed, status, charge)
		writeJSON(w, status, string(answer), map[string]string{"Idempotent-Replayed": "true"})
		return
	}
	st = &stored{fingerprint: fp, first: now}
	s.keys[key] = st
	s.mu.Unlock()
	s.charge(n, w, r, key, intent, body, st)
}

// charge makes request n's charge, stores its answer under st (nil for a
// keyless charge) and answers.
func (s *Server) charge(n int, w http.ResponseWriter, r *http.Request, key, intent string, body []byte, st *stored) {
	if s.processing != nil {
		s.processing(n, r)
	}
	if s.failure != nil {
		if status, failed := s.failure(n, r); failed {
			s.mu.Lock()
			if st != nil && s.keys[key] == st {
				delete(s.keys, key)
			}
			s.requests[n-1].Outcome, s.requests[n-1].Status = Failed, status
			s.mu.Unlock()
			writeJSON(w, status, `{"error":{"type":"api_error","message":"the charge failed; nothing was charged"}}`, nil)
			return
		}
	}
	s.mu.Lock()
	c := Charge{ID: fmt.Sprintf("ch_%d", len(s.charges)+1), Key: key, Intent: intent, Body: body, Header: r.Header.Clone(), At: s.now()}
	id := c.ID
	var answer []byte
	if s.answerBody != nil {
		answer = s.answerBody(c)
	} else {
		answer, _ = json.Marshal(Answer{Charge: id, Intent: intent, Key: key})
	}
	s.charges = append(s.charges, c)
	if st != nil {
		st.done, st.status, st.body, st.charge = true, s.status, answer, id
	}
	s.requests[n-1].Outcome, s.requests[n-1].Status, s.requests[n-1].Charge = Charged, s.status, id
	after := s.afterCharge
	s.mu.Unlock()
	if after != nil && after(n, w, r) {
		return
	}
	writeJSON(w, s.status, string(answer), nil)
}

// settle records what the server did with request n.
func (s *Server) settle(n int, o Outcome, status int, charge string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[n-1].Outcome, s.requests[n-1].Status, s.requests[n-1].Charge = o, status, charge
}

func writeJSON(w http.ResponseWriter, status int, body string, hdr map[string]string) {
	w.Header().Set("Content-Type", "application/json")
	for k, v := range hdr {
		w.Header().Set(k, v)
	}
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// bareKey returns a key without the quotes of the IETF draft's
// sf-string form.
func bareKey(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// Charges returns every charge made, in order.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Charge(nil), s.charges...)
}

// ChargesOf returns the charges made for intent, in order.
func (s *Server) ChargesOf(intent string) []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Charge
	for _, c := range s.charges {
		if c.Intent == intent {
			out = append(out, c)
		}
	}
	return out
}

// ChargesUnder returns the charges made under key, in order: more than one
// only if the server forgot the key in between (its key window).
func (s *Server) ChargesUnder(key string) []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Charge
	for _, c := range s.charges {
		if c.Key == key && key != "" {
			out = append(out, c)
		}
	}
	return out
}

// Requests returns every request received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	copy(out, s.requests)
	return out
}

// ParseAnswer reads a charge's answer from a response body: the charge, its
// intent and its key. ok is false for a body that is not one.
func ParseAnswer(body []byte) (a Answer, ok bool) {
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&a); err != nil || a.Charge == "" {
		return Answer{}, false
	}
	return a, true
}

// HijackAndClose cuts the connection of w without an answer, if it can be
// hijacked (a real HTTP/1 connection): to the client it looks exactly like
// an answer lost on the way back. It reports whether it could.
func HijackAndClose(w http.ResponseWriter) bool {
	h, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	conn, _, err := h.Hijack()
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
