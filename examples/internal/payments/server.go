package payments

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoints and headers of the payment server.
const (
	// ChargesPath requires an Idempotency-Key (400 without one).
	ChargesPath = "/v1/charges"
	// LegacyChargesPath takes charges without a key: what a naive client
	// calls, and why it can charge twice.
	LegacyChargesPath = "/v1/legacy/charges"
	// KeyHeader carries the idempotency key.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader marks an answer replayed from the key store.
	ReplayedHeader = "Idempotent-Replayed"
	// ClientHeader names the simulated client, for the server's log only.
	ClientHeader = "X-Sim-Client"
)

// StatusDropped is logged for a request whose connection the server cut.
const StatusDropped = 0

// ServerConfig sets the server's behaviour. Durations are virtual time.
type ServerConfig struct {
	Clock  *Clock
	Epoch  time.Time // virtual time the run started; the log counts from it (see SetEpoch)
	Faults FaultPlan // nil: no faults
	Outage Outage
	// Capacity is how many charges may process at once; more are answered
	// 429 with Retry-After: 1. WarmCapacity applies during the outage's
	// warm-up, and more are shed with 503. Zero means unlimited.
	Capacity, WarmCapacity int
	ProcessTime, SlowTime  time.Duration
	// OnCommit, if set, is called after each charge commits; if it returns
	// true the connection is cut before the answer, as for Drop. The
	// restart phase uses it to kill a client exactly there.
	OnCommit func(intent string) bool
	// FailRate is the share of requests on the keyed endpoint that fail
	// fast with 503 (no Retry-After) while the server is failing (see
	// SetFailing), before the key store is touched: nothing is charged.
	// Which ones is decided by a hash of FailSeed, the intent and how many
	// requests for it came before, so that every client meets the same
	// failures whatever its timing. 1 fails them all: an outage.
	FailRate float64
	FailSeed int64
}

// Request is one request as the server saw it: the server's ledger, from
// which the scenario's checks count what happened.
type Request struct {
	At       time.Duration // arrival, virtual time since Epoch
	Client   string
	Intent   string // empty if the body was not read
	Key      string // Idempotency-Key on the keyed endpoint; empty on the legacy one
	Status   int    // StatusDropped if the connection was cut
	Replayed bool   // answered from the key store
	Charged  bool   // this request committed a charge
}

// Server is the payment server. Start it with NewServer; Close it to wait
// for its handlers (including slow ones answering clients long gone).
type Server struct {
	cfg  ServerConfig
	http *httptest.Server
	keys keyStore

	epoch    atomic.Int64 // Epoch in Unix nanoseconds
	inflight atomic.Int64
	late     atomic.Int64
	failing  atomic.Bool // FailRate applies

	mu        sync.Mutex
	log       []Request
	processed map[string]int // processings per intent, for the fault plan
	arrived   map[string]int // keyed requests per intent while failing, for FailRate
	charges   map[string]int // committed charges per intent
	faulted   map[string]bool
}

// NewServer starts a payment server on a loopback port.
func NewServer(cfg ServerConfig) *Server {
	s := &Server{cfg: cfg, processed: map[string]int{}, arrived: map[string]int{}, charges: map[string]int{}, faulted: map[string]bool{}}
	s.SetEpoch(cfg.Epoch)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+ChargesPath, func(w http.ResponseWriter, r *http.Request) { s.handle(w, r, true) })
	mux.HandleFunc("POST "+LegacyChargesPath, func(w http.ResponseWriter, r *http.Request) { s.handle(w, r, false) })
	s.http = httptest.NewServer(mux)
	return s
}

// URL returns the server's base URL.
func (s *Server) URL() string { return s.http.URL }

// Close stops the server and waits for every handler to return.
func (s *Server) Close() { s.http.Close() }

// Log returns a copy of the requests seen so far.
func (s *Server) Log() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// Charges returns the committed charges per intent.
func (s *Server) Charges() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.charges))
	for k, v := range s.charges {
		out[k] = v
	}
	return out
}

// LateAnswers counts answers written after the client had hung up.
func (s *Server) LateAnswers() int { return int(s.late.Load()) }

// Faulted returns the intents one of whose processings the fault plan
// faulted (dropped, slowed or failed).
func (s *Server) Faulted() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.faulted))
	for k := range s.faulted {
		out[k] = true
	}
	return out
}

// SetFailing starts (true) or ends (false) the window in which FailRate
// applies.
func (s *Server) SetFailing(on bool) { s.failing.Store(on) }

// SetEpoch moves the start of the run, from which the log, the outage and
// the buckets count.
func (s *Server) SetEpoch(t time.Time) { s.epoch.Store(t.UnixNano()) }

func (s *Server) elapsed() time.Duration {
	return s.cfg.Clock.Now().Sub(time.Unix(0, s.epoch.Load()))
}

type chargeRequest struct {
	Intent string `json:"intent"`
	Amount int    `json:"amount"`
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request, keyed bool) {
	rec := Request{At: s.elapsed(), Client: r.Header.Get(ClientHeader)}
	defer func() {
		s.mu.Lock()
		s.log = append(s.log, rec)
		s.mu.Unlock()
	}()
	// A front door that is down answers before reading anything.
	if s.cfg.Outage.down(rec.At) {
		rec.Status = reply(w, http.StatusServiceUnavailable, errorBody("service unavailable"))
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 4<<10))
	var req chargeRequest
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil || req.Intent == "" || req.Amount <= 0 {
		rec.Status = reply(w, http.StatusBadRequest, errorBody("malformed charge"))
		return
	}
	rec.Intent = req.Intent
	key := r.Header.Get(KeyHeader)
	if keyed {
		rec.Key = key
	}
	if keyed && key == "" {
		rec.Status = reply(w, http.StatusBadRequest, errorBody("Idempotency-Key required"))
		return
	}
	if keyed && s.fails(req.Intent) {
		rec.Status = reply(w, http.StatusServiceUnavailable, errorBody("service unavailable"))
		return
	}
	// The legacy endpoint ignores keys altogether: it is what a client
	// without keys relies on, and nothing there dedupes a resend.
	if keyed {
		v, e := s.keys.begin(key, sha256.Sum256(raw))
		switch v {
		case replay:
			w.Header().Set(ReplayedHeader, "true")
			rec.Status, rec.Replayed = reply(w, e.status, e.body), true
			return
		case inFlight:
			rec.Status = reply(w, http.StatusConflict, errorBody("a request with this key is in progress"))
			return
		case mismatch:
			rec.Status = reply(w, http.StatusUnprocessableEntity, errorBody("key reused with another payload"))
			return
		}
	}
	release, status := s.admit(rec.At)
	if status != 0 {
		if keyed {
			s.keys.abort(key) // turned away unprocessed: the retry starts afresh
		}
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		rec.Status = reply(w, status, errorBody("over capacity"))
		return
	}
	status, body, drop := s.process(req.Intent)
	rec.Charged = status == http.StatusOK
	release()
	if keyed {
		s.keys.finish(key, status, body) // stored before the answer can be lost
	}
	if drop {
		rec.Status = StatusDropped
		cut(w)
		return
	}
	rec.Status = reply(w, status, body)
	if r.Context().Err() != nil {
		s.late.Add(1) // the client timed out and hung up: nobody reads this
	}
}

// fails says whether FailRate fails this keyed request for intent, and
// counts it.
func (s *Server) fails(intent string) bool {
	if s.cfg.FailRate <= 0 || !s.failing.Load() {
		return false
	}
	s.mu.Lock()
	n := s.arrived[intent]
	s.arrived[intent]++
	s.mu.Unlock()
	return s.cfg.FailRate >= 1 || unitHash(s.cfg.FailSeed, "fail", intent, strconv.Itoa(n)) < s.cfg.FailRate
}

// admit takes a processing slot, or says why not: 429 above capacity, 503
// above the warm-up's reduced capacity.
func (s *Server) admit(t time.Duration) (release func(), status int) {
	limit, status := s.cfg.Capacity, http.StatusTooManyRequests
	if s.cfg.Outage.warming(t) {
		limit, status = s.cfg.WarmCapacity, http.StatusServiceUnavailable
	}
	if n := s.inflight.Add(1); limit > 0 && n > int64(limit) {
		s.inflight.Add(-1)
		return nil, status
	}
	return func() { s.inflight.Add(-1) }, 0
}

// process performs one charge: wait, commit, and say whether to drop.
func (s *Server) process(intent string) (status int, body []byte, drop bool) {
	s.mu.Lock()
	n := s.processed[intent]
	s.processed[intent]++
	s.mu.Unlock()
	fault := NoFault
	if s.cfg.Faults != nil {
		fault = s.cfg.Faults(intent, n)
	}
	if fault != NoFault {
		s.mu.Lock()
		s.faulted[intent] = true
		s.mu.Unlock()
	}
	if fault == Slow {
		s.cfg.Clock.Sleep(s.cfg.SlowTime)
	} else {
		s.cfg.Clock.Sleep(s.cfg.ProcessTime)
	}
	if fault == Error500 {
		return http.StatusInternalServerError, errorBody("processor error"), false
	}
	s.mu.Lock()
	s.charges[intent]++
	id := fmt.Sprintf("ch_%s_%d", intent, s.charges[intent])
	s.mu.Unlock()
	drop = fault == Drop
	if s.cfg.OnCommit != nil && s.cfg.OnCommit(intent) {
		drop = true
	}
	body, _ = json.Marshal(map[string]string{"id": id, "intent": intent, "status": "succeeded"})
	return http.StatusOK, body, drop
}

func reply(w http.ResponseWriter, status int, body []byte) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
	return status
}

func errorBody(msg string) []byte {
	b, _ := json.Marshal(map[string]map[string]string{"error": {"message": msg}})
	return b
}

// cut closes the connection without an answer: the client sees EOF.
func cut(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler) // no hijacking: abort, which also cuts
}
