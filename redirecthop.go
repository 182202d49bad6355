package idemretry

// This file holds what makes a 307/308 hop that http.Client follows part of
// its unnamed parent's action (README, guarantee 2): a repeat of a payment
// whose answer was such a redirect is a tap of it while the hop is
// unfinished, and a new payment once the hop is done.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/idemretry/idemretry/journal"
)

// hopUnfinished reports whether rec, a done action named by its
// fingerprint, was answered with a 307 or 308 whose hop (the sub-action
// named by rec's key, see actionID) is in flight in this Transport or
// unfinished in the journal (but for a done this Transport holds, not yet
// written). Only then does it ask the journal. A journal that hashes ids
// lists a hop by its digest: only a hop this Transport sent is recognised
// then (hopIDs).
func (t *Transport) hopUnfinished(ctx context.Context, rec journal.Record) (bool, error) {
	if rec.Status != http.StatusTemporaryRedirect && rec.Status != http.StatusPermanentRedirect {
		return false, nil
	}
	prefix := keyActionPrefix + rec.Key + redirectActionInfix
	if t.flights.inAir(prefix) {
		return true, nil
	}
	recs, err := t.journal.Unfinished(ctx)
	var ce *journal.CorruptRecordsError
	if err != nil && (!errors.As(err, &ce) || ce == nil) {
		return false, err // a typed nil CorruptRecordsError names no record
	}
	for _, r := range recs {
		if !t.isHopOf(r.ActionID, prefix) {
			continue
		}
		if u, ok := t.unlanded.get(r.ActionID); ok && u.rec.Key == r.Key && u.rec.State == journal.StateDone {
			// Finished: its done is held here until the journal takes
			// it (landing.go), which still lists it pending.
			continue
		}
		return true, nil
	}
	if ce != nil {
		// The corrupt records the journal names beside the list: one of
		// the hop is unfinished as far as anyone can tell (a repeat is a
		// tap of it, and the hop's reservation refuses the damaged
		// record); another action's does not hold this one up. Records
		// left out unnamed might be the hop's: the journal's error stands.
		for _, id := range ce.IDs {
			if t.isHopOf(id, prefix) {
				return true, nil
			}
		}
		if len(ce.IDs) == 0 || len(ce.Errs) > len(ce.IDs) {
			return false, err
		}
	}
	return false, nil
}

// isHopOf reports whether id, as Unfinished lists it, is the id of a hop
// whose id starts with prefix. A journal that hashes ids lists a hop by its
// digest: only a hop this Transport sent is known by it (hopIDs).
func (t *Transport) isHopOf(id, prefix string) bool {
	if journal.IsDigest(id) {
		var ok bool
		if id, ok = t.hops.id(id); !ok {
			return false
		}
	}
	return strings.HasPrefix(id, prefix)
}

// hopIDs are the ids of the live 307/308 hops of unnamed payments that
// this Transport reserved and whose done it has not recorded, by their
// digests (journal.Digest): a journal that hashes ids lists a pending hop
// by its digest alone, which hopUnfinished must tell from its parent's
// key. A hop leaves once its done is recorded; one left unfinished stays
// while the Transport lives, as it does in the journal.
type hopIDs struct {
	mu sync.Mutex
	m  map[string]string
}

func (h *hopIDs) add(id string) {
	d := journal.Digest(id)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string]string)
	}
	h.m[d] = id
}

// drop forgets the hop id, once its done is recorded.
func (h *hopIDs) drop(id string) {
	d := journal.Digest(id)
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, d)
}

// id returns the hop id whose digest is digest, if this Transport holds it.
func (h *hopIDs) id(digest string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id, ok := h.m[digest]
	return id, ok
}
