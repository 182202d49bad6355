package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"
)

// paymentRequest is what the app posts to /v1/payments.
type paymentRequest struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// A charge is one payment the server made: what the ledger counts.
type charge struct {
	ID    string
	Order string
	Key   string // the Idempotency-Key it was charged under
	// In the ledger: the requests that came with Key, and how many of
	// them were answered with the stored answer.
	Requests, Replays int
}

// keyEntry is what the server keeps per Idempotency-Key, as Stripe does: the
// payload it first came with and the answer it gave, which it replays.
type keyEntry struct {
	body     []byte
	status   int
	answer   []byte
	requests int // requests that came with this key
	replays  int // of them, answered with the stored answer
}

// A commit tells the parent that the server charged a payment whose answer
// it holds back: the moment to kill the app.
type commit struct {
	Order, ChargeID, Key string
}

// paymentServer charges each Idempotency-Key once and replays its stored
// answer, with Idempotent-Replayed: true, to every later request with the
// key; a request whose key came with another payload gets 422, one without
// a key is charged every time. It keeps a ledger of the charges it made.
type paymentServer struct {
	srv *http.Server
	url string

	mu      sync.Mutex
	charges []charge
	keys    map[string]*keyEntry
	holdFor string // the order whose first charge's answer is held back
	held    bool

	committed chan commit   // the held-back commit, to the parent
	quit      chan struct{} // closed by close: a held handler returns
}

// startServer serves on loopback; the first charge of holdFor is committed
// and then announced on committed, and its answer never sent.
func startServer(holdFor string) (*paymentServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &paymentServer{
		url:       "http://" + ln.Addr().String(),
		keys:      map[string]*keyEntry{},
		holdFor:   holdFor,
		committed: make(chan commit, 1),
		quit:      make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", s.pay)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *paymentServer) pay(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var p paymentRequest
	if err == nil {
		err = json.Unmarshal(body, &p)
	}
	if err != nil || p.Order == "" {
		http.Error(w, `{"error":"bad payment"}`, http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")

	s.mu.Lock()
	if e := s.keys[key]; key != "" && e != nil {
		e.requests++
		if !bytes.Equal(e.body, body) {
			s.mu.Unlock()
			http.Error(w, `{"error":"key reused for another payload"}`, http.StatusUnprocessableEntity)
			return
		}
		e.replays++
		status, answer := e.status, e.answer
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(status)
		_, _ = w.Write(answer)
		return
	}
	// Charge, and store the answer with the key, in one step (one
	// database transaction, on a real server).
	c := charge{ID: "ch_" + strconv.Itoa(len(s.charges)+1), Order: p.Order, Key: key}
	s.charges = append(s.charges, c)
	answer, _ := json.Marshal(map[string]any{"id": c.ID, "order": p.Order, "amount": p.Amount, "status": "succeeded"})
	if key != "" {
		s.keys[key] = &keyEntry{body: body, status: http.StatusOK, answer: answer, requests: 1}
	}
	hold := p.Order == s.holdFor && !s.held
	s.held = s.held || hold
	s.mu.Unlock()

	if hold {
		// Committed: tell the parent, which kills the app, and never
		// answer. The handler returns once the dead app's connection
		// closes (or the server is closed).
		s.committed <- commit{Order: p.Order, ChargeID: c.ID, Key: key}
		select {
		case <-r.Context().Done():
		case <-s.quit:
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(answer)
}

// close stops the server; Shutdown returns once every handler has (a held
// one returns when quit is closed).
func (s *paymentServer) close() {
	close(s.quit)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		_ = s.srv.Close()
	}
}

// A ledgerLine is one order as the server's ledger has it.
type ledgerLine struct {
	Order   string
	Charges []charge
}

// ledger returns the server's ledger for orders (in that order, charged or
// not), followed by any charge for an order not among them.
func (s *paymentServer) ledger(orders []string) []ledgerLine {
	s.mu.Lock()
	defer s.mu.Unlock()
	byOrder := map[string]*ledgerLine{}
	var out []*ledgerLine
	for _, o := range orders {
		l := &ledgerLine{Order: o}
		byOrder[o] = l
		out = append(out, l)
	}
	var strays []string
	for _, c := range s.charges {
		l := byOrder[c.Order]
		if l == nil {
			l = &ledgerLine{Order: c.Order}
			byOrder[c.Order] = l
			strays = append(strays, c.Order)
		}
		c.Requests, c.Replays = 1, 0
		if e := s.keys[c.Key]; e != nil {
			c.Requests, c.Replays = e.requests, e.replays
		}
		l.Charges = append(l.Charges, c)
	}
	sort.Strings(strays)
	for _, o := range strays {
		out = append(out, byOrder[o])
	}
	lines := make([]ledgerLine, len(out))
	for i, l := range out {
		lines[i] = *l
	}
	return lines
}
