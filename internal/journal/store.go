package journal

import (
	"context"
	"fmt"
	"os"
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
	// The observed time (see expired): obsNs is the time the Store has seen
	// pass while open, accumulated across opens (persisted in ms); obsRef
	// is the clock reading it was last advanced at; savedObs is the
	// observed time, in ms, last written to the file.
	obsNs    int64
	obsRef   time.Time
	savedObs int64

	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closed    chan struct{} // closed once Close has finished: lock released
	compactCh chan chan error

	// ident is the identity of the file f (see present). The committer
	// changes it, holding identMu from a compaction's rename until it is
	// updated; others read it holding identMu.
	identMu sync.Mutex
	ident   os.FileInfo

	// Owned by the committer goroutine (by Open before it starts).
	f        File
	gen      uint32
	nextSeq  uint64
	size     int64
	sizeSeen int64 // size under mu, for Stats
	buf      []byte
	closeErr error
}

// slot is a record in memory: 72 bytes plus the map's id string.
type slot struct {
	key      [16]byte
	fp       [32]byte
	created  int64
	seen     int64 // the observed time at creation, ms (see expired)
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
	return slot{key: r.key, fp: r.fp, created: r.created, seen: r.seen, attempts: r.attempts, status: r.status, state: r.state, custom: r.custom != ""}
}

func (s *Store) recOf(id string, sl *slot) rec {
	r := rec{id: id, key: sl.key, fp: sl.fp, created: sl.created, seen: sl.seen, hasSeen: true, attempts: sl.attempts, status: sl.status, state: sl.state}
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

// times are the two times expiry judges by (see expired).
type times struct {
	// wall is the clock's time, Unix ms: the highest time seen, so that a
	// clock set back cannot bring an expired record back; unless that mark
	// is more than MaxClockLead ahead of the clock, which means the clock
	// ran ahead and was corrected, and then the clock.
	wall int64
	// obs is the observed time, ms: how much time the Store has seen pass
	// while open, over all its opens.
	obs int64
}

// now reads the clock and returns the times expiry judges by. Callers hold
// mu.
func (s *Store) now() times {
	c := s.opts.Now()
	s.observe(c)
	t := c.UnixMilli()
	if t > s.high {
		s.high = t
	}
	if s.high-t > s.opts.MaxClockLead.Milliseconds() {
		return times{wall: t, obs: s.obsNs / 1e6}
	}
	return times{wall: s.high, obs: s.obsNs / 1e6}
}

// observe advances the observed time by what passed since the last reading
// that advanced it. Readings of time.Now carry Go's monotonic clock, which
// no setting of the wall clock moves (and which stands still while the
// machine sleeps), so the observed time is a lower bound of the time that
// really passed while the Store was open. A clock without monotonic
// readings (a test's fake) is believed when it moves forward past its
// highest reading; a step back advances nothing until it is passed again.
// Callers hold mu (Open: before the Store is shared).
func (s *Store) observe(c time.Time) {
	if d := c.Sub(s.obsRef); d > 0 {
		s.obsNs += int64(d)
		s.obsRef = c
	}
}

// seenAt is the observed time to record in a record created now (after
// now), in ms, rounded up: a record never looks older than it is. Callers
// hold mu.
func (s *Store) seenAt() int64 { return (s.obsNs + 1e6 - 1) / 1e6 }

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

// expired reports whether a record's retention is over. Only done records
// expire. Pending and unknown ones are kept until Forget: dropping them
// would let a new key be minted for an action whose outcome is unknown.
//
// A record whose outcome may exist must never vanish because of a clock. A
// wall clock can be wrong when a record is made (a phone 49 h behind, then
// corrected) and can jump while the journal is closed, so the creation time
// read against the clock can make a ten-minute-old record look two days
// old: dropping it would let Reserve mint a new key for an action that the
// server has just performed. So a done record expires only when both say
// its retention is over: the clock (its creation time against the times
// mark, as the Transport reads key windows), and the observed time, the
// time the Store has itself seen pass since the record's creation, counted
// on the monotonic clock while open and persisted with its writes. Time
// while the journal is closed is never counted: nothing can tell how long
// that was. Since the observed time is a lower bound of the time that
// passed, a record disappears only once its retention has passed as far as
// the journal can know; no clock setting, before or during a run, can
// shorten that.
//
// The cost is disk and memory (about 77 bytes on disk and 140 in memory per
// done record) for an application that is rarely open: its done records
// stay until it has been open for the retention in all (48 h of use by
// default: for an app open a few minutes a day, years). An application that
// must bound that can Forget the actions it has reconciled.
func (s *Store) expired(sl *slot, now times) bool {
	ret := s.opts.Retention.Milliseconds()
	return sl.state == StateDone && now.wall-sl.created > ret && now.obs-sl.seen > ret
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
	r.seen, r.hasSeen = s.seenAt(), true
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
			// Nothing to write: check that there is still a journal to
			// have written to (see present).
			s.identMu.Lock()
			err := s.present()
			s.identMu.Unlock()
			if err != nil {
				s.mu.Lock()
				s.poisonLocked(err)
				err = s.usable()
				s.mu.Unlock()
			}
			return err
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
