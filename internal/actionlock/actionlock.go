// Package actionlock serialises work per action id within one process, so
// that a double-click runs one attempt sequence at a time instead of racing
// two under one key (which a server answers with 409).
package actionlock

import (
	"context"
	"sync"
)

// Set is a set of named locks. Its zero value is ready to use; it is safe for
// concurrent use. Entries are freed when no one holds or waits for them.
type Set struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	ch   chan struct{} // holds a token while locked
	refs int           // holders and waiters
}

// Lock takes the lock named id, waiting until it is free or ctx is done.
// On success it returns the function that releases it, which must be called
// exactly once.
func (s *Set) Lock(ctx context.Context, id string) (unlock func(), err error) {
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[string]*entry)
	}
	e := s.m[id]
	if e == nil {
		e = &entry{ch: make(chan struct{}, 1)}
		s.m[id] = e
	}
	e.refs++
	s.mu.Unlock()

	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; s.release(id, e) }, nil
	case <-ctx.Done():
		s.release(id, e)
		return nil, ctx.Err()
	}
}

func (s *Set) release(id string, e *entry) {
	s.mu.Lock()
	e.refs--
	if e.refs == 0 {
		delete(s.m, id)
	}
	s.mu.Unlock()
}

// Len returns how many ids have holders or waiters (for tests).
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
