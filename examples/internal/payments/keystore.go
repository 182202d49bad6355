package payments

import (
	"crypto/sha256"
	"sync"
)

// keyStore is the server's idempotency layer, as Stripe documents it: the
// first request with a key is processed and its answer stored, whatever the
// status (500s included); later requests with the key get that answer again.
type keyStore struct {
	mu sync.Mutex
	m  map[string]*keyEntry
}

type keyEntry struct {
	fp     [sha256.Size]byte // of the first request's body
	done   bool
	status int
	body   []byte
}

// verdict is what the idempotency layer decides for one keyed request.
type verdict int

const (
	fresh    verdict = iota // new key: process it
	replay                  // answer stored: send it again
	inFlight                // the first request is still processing: 409
	mismatch                // same key, other payload: 422
)

// begin looks the key up and, for a new key, marks it as processing.
func (s *keyStore) begin(key string, fp [sha256.Size]byte) (verdict, *keyEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]*keyEntry)
	}
	e, ok := s.m[key]
	switch {
	case !ok:
		s.m[key] = &keyEntry{fp: fp}
		return fresh, nil
	case e.fp != fp:
		return mismatch, nil
	case !e.done:
		return inFlight, nil
	}
	cp := *e
	return replay, &cp
}

// abort forgets a key whose request was turned away before processing (a
// 429 or 503 at admission), so that its retry is processed afresh.
func (s *keyStore) abort(key string) {
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// finish stores the answer of a processed key.
func (s *keyStore) finish(key string, status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[key]; e != nil {
		e.done, e.status, e.body = true, status, body
	}
}
