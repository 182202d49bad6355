package journal

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemretry/idemretry/internal/lockfile"
)

// Store is an open journal. Its methods are safe for concurrent use.
//
// Concurrency: one mutex guards the in-memory index and the queue of
// operations to write; one committer goroutine owns the file, takes the
// whole queue as a batch, writes it as one frame (or a few, for huge
// batches), syncs, and then wakes the batch's waiters. Callers that arrive
// while a batch syncs form the next batch: natural group commit.
type Store struct {
	opts Options
	dir  string
	path string
	lock *lockfile.Lock

	mu        sync.Mutex
	m         map[string]slot   // live records by stored id
	custom    map[string]string // non-UUID keys, by stored id (rare)
	live      int64             // encoded size of the records in m
	inflight  map[string]*batch // records created by a batch not yet synced
	deleting  map[string]*batch // records removed by a batch not yet synced
	queue     []op
	cur       *batch // the batch that queue's operations belong to
	writing   *batch // the batch the committer is writing and syncing, or nil
	durable   bool   // cur has a waiter: write it now, not lazily
	closing   bool
	poison    error // set once a write or sync failed; the Store is dead
	high      int64 // clock high-water mark, Unix ms: time never runs back
	savedHigh int64 // the high-water mark last written to the file

	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closed    chan struct{} // closed once Close has finished: lock released
	compactCh chan chan error

	// Owned by the committer goroutine (by Open before it starts).
	f        File
	gen      uint32
	nextSeq  uint64
	size     int64
	sizeSeen int64 // size under mu, for Stats
	buf      []byte
	closeErr error
}

// slot is a record in memory: 64 bytes plus the map's id string.
type slot struct {
	key      [16]byte
	fp       [32]byte
	created  int64
	attempts uint32
	status   uint16
	state    uint8
	custom   bool // the key is in Store.custom
}

// batch is a group of operations written and synced together.
type batch struct {
	done chan struct{} // closed once err is set
	err  error
	ids  []string // ids whose creation waits on this batch (inflight)
	dels []string // ids whose removal waits on this batch (deleting)
}

func newBatch() *batch { return &batch{done: make(chan struct{})} }

func (s *Store) slotOf(r *rec) slot {
	return slot{key: r.key, fp: r.fp, created: r.created, attempts: r.attempts, status: r.status, state: r.state, custom: r.custom != ""}
}

func (s *Store) recOf(id string, sl *slot) rec {
	r := rec{id: id, key: sl.key, fp: sl.fp, created: sl.created, attempts: sl.attempts, status: sl.status, state: sl.state}
	if sl.custom {
		r.custom = s.custom[id]
	}
	return r
}

// put and del keep m, custom and live consistent. Callers hold mu.
func (s *Store) put(r *rec) {
	s.del(r.id)
	s.m[r.id] = s.slotOf(r)
	if r.custom != "" {
		s.custom[r.id] = r.custom
	}
	s.live += r.size()
}

func (s *Store) del(id string) {
	sl, ok := s.m[id]
	if !ok {
		return
	}
	r := s.recOf(id, &sl)
	s.live -= r.size()
	delete(s.m, id)
	if sl.custom {
		delete(s.custom, id)
	}
}

// now returns the time expiry judges by, in Unix ms: the highest time seen,
// so that a clock set back cannot bring an expired record back; unless that
// mark is more than MaxClockLead ahead of the clock, which means the clock
// ran ahead and was corrected, and then the clock. Callers hold mu.
func (s *Store) now() int64 {
	t := s.opts.Now().UnixMilli()
	if t > s.high {
		s.high = t
	}
	if s.high-t > s.opts.MaxClockLead.Milliseconds() {
		return t
	}
	return s.high
}

// Now returns the later of the clock and the highest time the Store has
// seen: in the records it loaded, in the clock marks persisted with its
// batches and snapshots, and from the clock itself. It never runs
// backwards, even across a reopen, whatever the clock does. When the clock
// is ahead it is returned as is; otherwise the mark, to the millisecond.
func (s *Store) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.opts.Now()
	if ms := t.UnixMilli(); ms >= s.high {
		s.high = ms
		return t
	}
	return time.UnixMilli(s.high)
}

// expired: only done records expire. Pending and unknown ones are kept until
// Forget: dropping them would let a new key be minted for an action whose
// outcome is unknown.
func (s *Store) expired(sl *slot, now int64) bool {
	return sl.state == StateDone && now-sl.created > s.opts.Retention.Milliseconds()
}

// usable returns the error for calls on a closed or failed Store.
func (s *Store) usable() error {
	if s.poison != nil {
		return fmt.Errorf("%w: %w", s.opts.ErrClosed, s.poison)
	}
	if s.closing {
		return s.opts.ErrClosed
	}
	return nil
}

func (s *Store) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// enqueue adds o to the current batch; with durable, the caller will wait
// for it. Callers hold mu.
func (s *Store) enqueue(o op, durable bool) *batch {
	s.queue = append(s.queue, o)
	if durable && !s.durable {
		s.durable = true
		s.signal()
	} else if len(s.queue) == 1 {
		s.signal() // let the committer arm its lazy-flush timer
	}
	return s.cur
}

func (s *Store) wait(ctx context.Context, b *batch) error {
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reserve returns the record of e.ID, creating it from e when there is none,
// or when reusePending is set and the record is done. A record it creates is
// synced before Reserve returns. A returned existing record is durable too:
// if another caller's creation of it is still syncing, Reserve waits for it.
// An expired done record counts as absent (and is forgotten lazily).
func (s *Store) Reserve(ctx context.Context, e Entry, reusePending bool) (Entry, bool, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, false, err
	}
	r, err := toRec(e)
	if err != nil {
		return Entry{}, false, err
	}
	s.mu.Lock()
	if err := s.usable(); err != nil {
		s.mu.Unlock()
		return Entry{}, false, err
	}
	now := s.now()
	if sl, ok := s.m[r.id]; ok {
		if s.expired(&sl, now) {
			s.remove(r.id, false)
		} else if !reusePending || sl.state != StateDone {
			old := s.recOf(r.id, &sl)
			b := s.inflight[r.id]
			s.mu.Unlock()
			if b != nil {
				if err := s.wait(ctx, b); err != nil {
					return Entry{}, false, err
				}
			}
			return old.entry(), false, nil
		}
	}
	if sl, ok := s.m[r.id]; ok && s.sameKey(&sl, &r) {
		// A done record replaced by a record with the same key (a caller's
		// own key): write the removal first, or replay would take the new
		// record for a stale update of the done one (see applyUpdate).
		s.remove(r.id, false)
	}
	s.put(&r)
	b := s.enqueue(op{kind: opUpsert, r: r}, true)
	s.inflight[r.id] = b
	b.ids = append(b.ids, r.id)
	s.mu.Unlock()
	if err := s.wait(ctx, b); err != nil {
		return Entry{}, false, err
	}
	return r.entry(), true, nil
}

// Update stores the state, attempts and status of an existing action whose
// record has the given key. Done is final: a done record keeps its state
// and status, and attempts never go down (see applyUpdate); an update that
// changes nothing is not written. The change is written with the next batch, or
// within FlushInterval, or at Close, whichever comes first; Sync waits for
// it. It returns an error wrapping Options.ErrNotFound, and changes
// nothing, if the action has no (unexpired) record or if its record has
// another key (it was replaced, or forgotten and created anew, since the
// caller read it).
func (s *Store) Update(id, key string, state uint8, attempts uint32, status uint16) error {
	if state < StatePending || state > StateUnknown {
		return fmt.Errorf("%w: state %d", ErrInvalidRecord, state)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	sl, ok := s.m[id]
	if !ok || s.expired(&sl, s.now()) || !s.hasKey(id, &sl, key) {
		return s.opts.ErrNotFound
	}
	r := s.recOf(id, &sl)
	if !applyUpdate(&r, state, attempts, status) {
		return nil // nothing changes: a done record's late, stale update
	}
	s.put(&r)
	s.enqueue(op{kind: opUpsert, r: r}, false)
	return nil
}

// applyUpdate applies an update of state, attempts and status to r, the
// record with the update's key, and reports whether r changed. Done is
// final: a done record keeps its state and status whatever a later update
// says (a stale writer must not undo a recorded outcome), and attempts
// never go down. Replay applies the same rule to the upserts it reads, so a
// stale frame written after a done one cannot undo it on restart either.
func applyUpdate(r *rec, state uint8, attempts uint32, status uint16) bool {
	old := *r
	if r.state != StateDone {
		r.state, r.status = state, status
	}
	r.attempts = max(r.attempts, attempts)
	return *r != old
}

// hasKey reports whether the record sl of id has the given key, compared
// in storage form: a canonical UUID as 16 bytes, any other key as is.
// Callers hold mu.
func (s *Store) hasKey(id string, sl *slot, key string) bool {
	var k [16]byte
	if parseUUID(key, &k) {
		return !sl.custom && sl.key == k
	}
	return sl.custom && s.custom[id] == key
}

// sameKey reports whether the record sl has r's key. Callers hold mu.
func (s *Store) sameKey(sl *slot, r *rec) bool {
	if r.custom != "" {
		return sl.custom && s.custom[r.id] == r.custom
	}
	return !sl.custom && sl.key == r.key
}

// remove drops id from the index and queues its delete, recording the
// batch in deleting until it is synced. Callers hold mu.
func (s *Store) remove(id string, durable bool) *batch {
	s.del(id)
	b := s.enqueue(op{kind: opDelete, r: rec{id: id}}, durable)
	s.deleting[id] = b
	b.dels = append(b.dels, id)
	return b
}

// Forget removes an action's record and returns once the removal is synced.
// An already-ended ctx is refused before anything changes. Forgetting an
// absent action returns at once, unless an earlier removal of it (another
// Forget, or Reserve dropping it as expired) is still queued or being
// written: then Forget waits for that removal to be synced too.
func (s *Store) Forget(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if err := s.usable(); err != nil {
		s.mu.Unlock()
		return err
	}
	var b *batch
	if _, ok := s.m[id]; ok {
		b = s.remove(id, true)
	} else if b = s.deleting[id]; b == nil {
		s.mu.Unlock()
		return nil
	} else if b == s.cur && !s.durable {
		// A lazy delete (of an expired record) still queued: write it now.
		s.durable = true
		s.signal()
	}
	s.mu.Unlock()
	return s.wait(ctx, b)
}

// Get returns the unexpired record of id.
func (s *Store) Get(id string) (Entry, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return Entry{}, false, err
	}
	sl, ok := s.m[id]
	if !ok || s.expired(&sl, s.now()) {
		return Entry{}, false, nil
	}
	r := s.recOf(id, &sl)
	return r.entry(), true, nil
}

// Unfinished returns the pending and unknown records, oldest first (ties by
// id).
func (s *Store) Unfinished() ([]Entry, error) {
	s.mu.Lock()
	if err := s.usable(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	var out []Entry
	for id, sl := range s.m {
		if sl.state == StatePending || sl.state == StateUnknown {
			r := s.recOf(id, &sl)
			out = append(out, r.entry())
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		if a.CreatedMs != b.CreatedMs {
			if a.CreatedMs < b.CreatedMs {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Sync waits until every update queued so far is durable: those still in
// the queue, and those of a batch the committer has taken but not yet
// synced. Batches are committed in order, so waiting for the queue's batch
// covers the one being written too.
func (s *Store) Sync(ctx context.Context) error {
	s.mu.Lock()
	if err := s.usable(); err != nil {
		s.mu.Unlock()
		return err
	}
	if len(s.queue) == 0 {
		b := s.writing
		s.mu.Unlock()
		if b == nil {
			return nil
		}
		return s.wait(ctx, b)
	}
	b := s.cur
	if !s.durable {
		s.durable = true
		s.signal()
	}
	s.mu.Unlock()
	return s.wait(ctx, b)
}

// Compact rewrites the journal now with only its live records.
func (s *Store) Compact(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case s.compactCh <- reply:
	case <-s.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.usable()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats describes the Store, for tests and monitoring.
type Stats struct {
	Records   int   // live records in memory
	LiveBytes int64 // their encoded size
	FileBytes int64 // the journal file's size after the last batch
}

// Stats returns the current Stats.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Records: len(s.m), LiveBytes: s.live, FileBytes: s.sizeSeen}
}

// Close writes and syncs the queued operations, stops the committer, closes
// the file and releases the lock. It returns the final flush's error, or the
// error that failed the Store earlier. Later calls, concurrent ones
// included, wait until the Store is fully closed (the lock released) and
// return nil.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		<-s.closed
		return nil
	}
	s.closing = true
	s.mu.Unlock()
	defer close(s.closed)
	close(s.stop)
	<-s.done
	err := s.closeErr
	if lerr := s.lock.Release(); err == nil && lerr != nil {
		err = fmt.Errorf("journal: release lock: %w", lerr)
	}
	return err
}
