package filejournal

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemretry/idemretry/internal/lockfile"
	"github.com/idemretry/idemretry/journal"
)

// Journal is the file-backed journal.Journal that idemretry's NewClient and
// NewTransport use by default. It keeps, per action, the action id (or its
// SHA-256, see WithHashedIDs), the key (16 bytes for a UUID), the request
// fingerprint, the creation time, the state, the attempt count and the
// final status: about 77 bytes on disk and 140 bytes of memory per record
// for a short action id (between compactions, its creation is appended as
// a delete then the record: a few bytes more than the id). Never a body, a
// header or a credential.
//
// A record that Reserve creates is on disk, synced, when Reserve returns;
// concurrent Reserves share one write and one sync (group commit). Updates
// are written lazily: with the next Reserve or Forget, within the flush
// interval (WithFlushInterval), at Close, or at once with Sync; losing one
// to a crash costs one resend under the same key, which the server answers
// with a replay (the Transport Syncs the "done" of actions named by their
// fingerprint, where a lost one would matter).
//
// A write or sync that fails (a full disk: ENOSPC) fails its batch alone.
// The calls waiting on it (Reserve of a new action, Forget, Sync) return an
// error wrapping journal.ErrUnavailable and the file system's error
// (errors.Is(err, syscall.ENOSPC)); a Reserve so refused leaves no record
// (and keeps the one it was to replace), so the Transport sends nothing.
// What was acknowledged before stays on disk; updates not yet written stay
// queued. Reads, and Reserves of recorded actions, go on from memory.
// Each later batch first reopens the file and cuts off what the failed one
// left (never syncing the failed descriptor again), then tries again: the
// first call after space returns succeeds, and queued updates are written
// within the flush interval even if no call comes. Only a journal removed
// or replaced on disk (ErrRemoved) stops the Journal: every later call then
// returns an error wrapping journal.ErrClosed; reopen it.
//
// A Journal is safe for concurrent use. Only one Journal can be open on a
// directory at a time, in this process or any other: see ErrLocked. Close
// it when done; the Transport closes the journal it opened itself.
//
// Inside, one mutex guards the in-memory index and the queue of operations
// to write; one committer goroutine owns the file, takes the whole queue as
// a batch, writes it as one frame (or a few, for huge batches), syncs, and
// then wakes the batch's waiters. Callers that arrive while a batch syncs
// form the next batch: natural group commit. Before it takes a batch, the
// committer lets the goroutines ready to run go first, so that callers a
// batch just released join the next one rather than each start their own;
// a lazy Update wakes no one (it arms the flush timer); Sync waits for the
// batch its updates are in, with everyone else's.
type Journal struct {
	opts config
	dir  string
	// secret is FingerprintSecret's (secret.go), set by Open when
	// hasSecret; never changed.
	secret    [32]byte
	hasSecret bool
	// secretChecked is when keepSecret last looked for fingerprint.key;
	// the committer's alone.
	secretChecked time.Time
	path          string
	lock          *lockfile.Lock
	// lockPath is LOCK's path, lockIdent the file the lock is on (see
	// lockHeld).
	lockPath  string
	lockIdent os.FileInfo
	recovery  Recovery

	mu       sync.Mutex
	m        map[string]ref    // live records by stored id, in slots
	slots    slab              // the records m refers to (see ref)
	custom   map[string]string // non-UUID keys, by stored id (rare)
	live     int64             // encoded size of the records in m
	inflight map[string]*batch // records created by a batch not yet synced
	// damaged are the actions whose records a salvage at Open may have
	// lost with a damaged frame (see lostActions), by stored id, each
	// with its error, until Forget (see Unfinished). Set by Open.
	damaged   map[string]error
	deleting  map[string]*batch // records removed by a batch not yet synced
	queue     []op
	cur       *batch // the batch that queue's operations belong to
	writing   *batch // the batch the committer is writing and syncing, or nil
	durable   bool   // cur has a waiter: write it now, not lazily
	closing   bool
	poison    error // set once a write or sync failed; the Journal is dead
	high      int64 // clock high-water mark, Unix ms: time never runs back
	savedHigh int64 // the high-water mark last written to the file
	// The observed time (see expired): obsNs is the time the Journal has seen
	// pass while open, accumulated across opens (persisted in ms); obsRef
	// is the clock reading it was last advanced at; savedObs is the
	// observed time, in ms, last written to the file.
	obsNs    int64
	obsRef   time.Time
	savedObs int64
	// oldest is the earliest creation time (wall) and observed time (obs)
	// of the records recovery replayed, whether or not they are still in
	// the index (see recoveredExpiredIDs); math.MaxInt64 with none. Open's
	// alone.
	oldest times

	// flushT is the lazy-flush timer (see enqueue); flushArmed tells that
	// it runs. Both under mu; flushT is made on first use (flushTimer).
	flushT     *time.Timer
	flushArmed bool
	// spare is the queue's other buffer: the committer hands back the
	// slice of the batch it wrote, so that queues do not grow anew each
	// batch. Under mu.
	spare []op

	// wake tells the committer there is work: a durable batch, or an
	// event in ev (see run). Buffered, signalled without blocking.
	wake   chan struct{}
	ev     events        // under mu
	done   chan struct{} // closed when the committer has stopped
	closed chan struct{} // closed once Close has finished: lock released

	// ident is the identity of the file f (see present). The committer
	// changes it, holding identMu from a compaction's rename until it is
	// updated; others read it holding identMu.
	identMu sync.Mutex
	ident   os.FileInfo
	// checkMu guards checking, the check of present a Sync started while
	// identMu was held, if it has not ended (see presentWithin).
	checkMu  sync.Mutex
	checking *presentCheck

	// Owned by the committer goroutine (by Open before it starts).
	f file
	// broken is why the last write failed, until repair has made the file
	// fit for the next one (see repair): f is then the descriptor that
	// failed, never written or synced again.
	broken   error
	gen      uint32
	nextSeq  uint64
	size     int64
	sizeSeen int64       // size under mu, for tests (stats)
	fw       frameWriter // scratch buffers of the batches' frames
	closeErr error
}

// slot is a record in memory: 72 bytes in Journal.slots, plus the map's id
// string and ref.
type slot struct {
	key      [16]byte
	fp       [32]byte
	created  int64
	seen     int64 // the observed time at creation, ms (see expired)
	attempts uint32
	status   uint16
	state    journal.State
	bits     uint8 // slotCustom, and the key's form (see form)
}

// slotCustom: the key is in Journal.custom. The bits above it are the
// key's form (journal.KeyForm), so that a slot stays within 72 bytes.
const slotCustom = 1

func (sl *slot) custom() bool { return sl.bits&slotCustom != 0 }

func (sl *slot) form() journal.KeyForm { return journal.KeyForm(sl.bits >> 1) }

// batch is a group of operations written and synced together.
type batch struct {
	done chan struct{} // closed once err is set
	err  error
	ids  []string // ids whose creation waits on this batch (inflight)
	dels []string // ids whose removal waits on this batch (deleting)
	// replaced holds the records that the creations of ids replaced (an
	// expired one, or a done one under ReusePending), by id, to be put
	// back should the batch fail (see failBatch); nil when none.
	replaced map[string]rec
}

func newBatch() *batch { return &batch{done: make(chan struct{})} }

func (j *Journal) slotOf(r *rec) slot {
	sl := slot{key: r.key, fp: r.fp, created: r.created, seen: r.seen, attempts: r.attempts, status: r.status, state: r.state,
		bits: uint8(r.form) << 1}
	if r.custom != "" {
		sl.bits |= slotCustom
	}
	return sl
}

func (j *Journal) recOf(id string, h *ref) rec {
	sl := j.slots.at(*h)
	r := rec{id: id, key: sl.key, fp: sl.fp, created: sl.created, seen: sl.seen, attempts: sl.attempts, status: sl.status, state: sl.state,
		form: sl.form()}
	if sl.custom() {
		r.custom = j.custom[id]
	}
	return r
}

// put and del keep m, custom and live consistent. Callers hold mu.
func (j *Journal) put(r *rec) {
	j.del(r.id)
	j.insert(r)
}

// insert is put for an id that m does not hold.
func (j *Journal) insert(r *rec) {
	j.m[r.id] = j.slots.alloc(j.slotOf(r))
	if r.custom != "" {
		j.custom[r.id] = r.custom
	}
	j.live += r.size()
}

func (j *Journal) del(id string) {
	h, ok := j.m[id]
	if !ok {
		return
	}
	r := j.recOf(id, &h)
	j.live -= r.size()
	delete(j.m, id)
	if j.slots.at(h).custom() {
		delete(j.custom, id)
	}
	j.slots.release(h)
}

// times are the two times expiry judges by (see expired).
type times struct {
	// wall is the clock's time, Unix ms: the highest time seen, so that a
	// clock set back cannot bring an expired record back; unless that mark
	// is more than MaxClockLead ahead of the clock, which means the clock
	// ran ahead and was corrected, and then the clock.
	wall int64
	// obs is the observed time, ms: how much time the Journal has seen pass
	// while open, over all its opens.
	obs int64
}

// now reads the clock and returns the times expiry judges by. Callers hold
// mu.
func (j *Journal) now() times {
	c := j.opts.now()
	j.observe(c)
	t := c.UnixMilli()
	if t > j.high {
		j.high = t
	}
	if j.high-t > j.opts.maxClockLead.Milliseconds() {
		return times{wall: t, obs: j.obsNs / 1e6}
	}
	return times{wall: j.high, obs: j.obsNs / 1e6}
}

// observe advances the observed time by what passed since the last reading
// that advanced it. Readings of time.Now carry Go's monotonic clock, which
// no setting of the wall clock moves (and which stands still while the
// machine sleeps), so the observed time is a lower bound of the time that
// really passed while the Journal was open. A clock without monotonic
// readings (a test's fake) is believed when it moves forward past its
// highest reading; a step back advances nothing until it is passed again.
// Callers hold mu (Open: before the Journal is shared).
func (j *Journal) observe(c time.Time) {
	if d := c.Sub(j.obsRef); d > 0 {
		j.obsNs += int64(d)
		j.obsRef = c
	}
}

// seenAt is the observed time to record in a record created now (after
// now), in ms, rounded up: a record never looks older than it is. Callers
// hold mu.
func (j *Journal) seenAt() int64 { return (j.obsNs + 1e6 - 1) / 1e6 }

// Now returns the journal's time (it makes the Journal a
// journal.Timekeeper): the later of its clock (WithClock) and the highest
// time it has seen, in the records it holds, in the clock marks persisted
// with its batches and snapshots, and from the clock itself. It never runs
// backwards, even across a reopen, whatever the clock does. When the clock
// is ahead it is returned as is; otherwise the mark, to the millisecond. A
// clock reading well behind it means the wall clock was set back (by NTP,
// or a user changing the phone's time): NewTransport logs that, since key
// windows are judged by the clock.
func (j *Journal) Now() time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	t := j.opts.now()
	if ms := t.UnixMilli(); ms >= j.high {
		j.high = ms
		return t
	}
	return time.UnixMilli(j.high)
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
// time the Journal has itself seen pass since the record's creation, counted
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
func (j *Journal) expired(h *ref, now times) bool {
	sl := j.slots.at(*h)
	ret := j.opts.retention.Milliseconds()
	return sl.state == journal.StateDone && now.wall-sl.created > ret && now.obs-sl.seen > ret
}

// usable returns the error for calls on a closed or failed Journal.
func (j *Journal) usable() error {
	if j.poison != nil {
		return fmt.Errorf("%w: %w", journal.ErrClosed, j.poison)
	}
	if j.closing {
		return journal.ErrClosed
	}
	return nil
}

func (j *Journal) signal() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// enqueue adds o to the current batch; with durable, the caller will wait
// for it, and the committer is woken to write the batch now. A lazy
// operation only arms the flush timer, if it is not running yet: the
// committer is not woken for it (that would cost each lazy Update a
// goroutine wake-up), and the timer, once it fires, writes whatever is
// queued then. Callers hold mu.
func (j *Journal) enqueue(o op, durable bool) *batch {
	j.queue = append(j.queue, o)
	if durable {
		if !j.durable {
			j.durable = true
			j.signal()
		}
	} else if !j.durable && !j.flushArmed {
		j.flushArmed = true
		j.flushTimer().Reset(j.opts.flushEvery)
	}
	return j.cur
}

// flushTimer returns the lazy-flush timer, made stopped on first use.
// Callers hold mu.
func (j *Journal) flushTimer() *time.Timer {
	if j.flushT == nil {
		j.flushT = time.AfterFunc(time.Hour, j.postFlush)
		j.flushT.Stop()
	}
	return j.flushT
}

func (j *Journal) wait(ctx context.Context, b *batch) error {
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// storedID is the id as the journal keys it. With WithHashedIDs it is the
// raw SHA-256 of the action id; an id already in the digest form that
// Unfinished returns (see journal.Digest) is taken as that digest, so a
// listed action can be passed back to Reserve, Update and Forget and
// reaches the same record.
func (j *Journal) storedID(actionID string) string {
	if !j.opts.hashed {
		return actionID
	}
	sum, _ := hex.DecodeString(strings.TrimPrefix(journal.Digest(actionID), journal.DigestPrefix))
	return string(sum)
}

// reportedID is the id Unfinished reports for a stored id: the id itself,
// or with WithHashedIDs its digest form.
func (j *Journal) reportedID(id string) string {
	if !j.opts.hashed {
		return id
	}
	return journal.DigestPrefix + hex.EncodeToString([]byte(id))
}

// checkStatus refuses a status that the file format cannot hold (it keeps
// 16 bits); journal.CheckProgress has refused the rest.
func checkStatus(rec journal.Record) error {
	if rec.Status > math.MaxUint16 {
		return fmt.Errorf("%w: status %d", journal.ErrInvalidRecord, rec.Status)
	}
	return nil
}

// Reserve implements journal.Journal. A record it creates is synced to
// disk before it returns; so is a returned record that another goroutine
// is still creating (Reserve waits for it). A journal.StateDone record
// whose retention is over, by the clock and by the time the journal has
// seen pass (see WithKeyWindow), counts as absent (and is forgotten
// lazily: its delete is written with the next batch). CreatedAt is kept to
// the millisecond. If ctx ends while Reserve waits for the sync, it returns
// ctx's error; the record may still become durable, and a later Reserve
// returns it. If the write fails, Reserve returns an error wrapping
// journal.ErrUnavailable and the cause, and the record is not kept (see
// Journal).
func (j *Journal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	got, created, err := j.reserve(ctx, rec, mode)
	if err != nil {
		// Only here: the id made an argument of wrap costs an allocation
		// even when there is nothing to wrap.
		err = wrap(err, "reserve %q", rec.ActionID)
	}
	return got, created, err
}

func (j *Journal) reserve(ctx context.Context, want journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return journal.Record{}, false, err
	}
	if err := journal.CheckRecord(want); err != nil {
		return journal.Record{}, false, err
	}
	if err := checkStatus(want); err != nil {
		return journal.Record{}, false, err
	}
	r := toRec(j.storedID(want.ActionID), want)
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return journal.Record{}, false, err
	}
	if err := j.damaged[r.id]; err != nil {
		// Its record was lost with a damaged frame: it may have been
		// sent under its key. Nothing is created in its place.
		j.mu.Unlock()
		return journal.Record{}, false, err
	}
	now := j.now()
	sl, found := j.m[r.id]
	if found && !j.expired(&sl, now) && (mode == journal.ReuseAny || j.slots.at(sl).state != journal.StateDone) {
		old := j.recOf(r.id, &sl)
		b := j.inflight[r.id]
		j.mu.Unlock()
		if b != nil {
			if err := j.wait(ctx, b); err != nil {
				return journal.Record{}, false, err
			}
		}
		return old.record(want.ActionID), false, nil
	}
	// A new record is written as a delete then an upsert, whatever the
	// index holds: replay must never take it for an update of an earlier
	// record of the action with the same key (a caller's own key, reused
	// once the done record of its earlier use expired, or replacing it),
	// which would keep the old record instead (done is final, see
	// applyUpdate). So the delete does not depend on what the index knows:
	// the file may hold a record the index does not (its delete lost with a
	// frame that salvage skipped, or any drop from the index whose delete
	// did not reach the file).
	if found {
		// Expired, or a done record replaced: put back should the batch
		// fail, as the Reserve is then refused.
		if j.cur.replaced == nil {
			j.cur.replaced = make(map[string]rec)
		}
		j.cur.replaced[r.id] = j.recOf(r.id, &sl)
		j.del(r.id)
		j.deleting[r.id] = j.cur
		j.cur.dels = append(j.cur.dels, r.id)
	} else {
		// What an earlier creation in this batch replaced was removed
		// since (a Forget): nothing to put back.
		delete(j.cur.replaced, r.id)
	}
	j.enqueue(op{kind: opDelete, create: true, r: rec{id: r.id}}, false)
	r.seen = j.seenAt()
	j.insert(&r) // m no longer holds r.id, if it did
	b := j.enqueue(op{kind: opUpsert, create: true, r: r}, true)
	j.inflight[r.id] = b
	b.ids = append(b.ids, r.id)
	j.mu.Unlock()
	if err := j.wait(ctx, b); err != nil {
		return journal.Record{}, false, err
	}
	return r.recordKeyed(want.ActionID, want.Key), true, nil
}

// Update implements journal.Journal: it stores the State, Attempts and
// Status of the action's record if that record has rec.Key. Done is final:
// a done record keeps its state and status, and attempts never go down
// (see applyUpdate); an update that changes nothing is not written. The
// change is written lazily (see Journal), with the next batch, within the
// flush interval, or at Close, whichever comes first; Sync waits for it.
// It returns an error wrapping journal.ErrNotFound, and changes nothing, if
// the action has no (unexpired) record or if its record has another key
// (it was replaced, or forgotten and created anew, since the caller read
// it).
func (j *Journal) Update(ctx context.Context, rec journal.Record) error {
	if err := j.update(rec); err != nil {
		return wrap(err, "update %q", rec.ActionID) // see Reserve
	}
	return nil
}

func (j *Journal) update(rec journal.Record) error {
	if err := journal.CheckProgress(rec); err != nil {
		return err
	}
	if err := checkStatus(rec); err != nil {
		return err
	}
	id := j.storedID(rec.ActionID)
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.usable(); err != nil {
		return err
	}
	sl, ok := j.m[id]
	if !ok || j.expired(&sl, j.now()) || !j.hasKey(id, &sl, rec.Key) {
		return journal.ErrNotFound
	}
	r := j.recOf(id, &sl)
	before := r.size()
	if !applyUpdate(&r, rec.State, uint32(rec.Attempts), uint16(rec.Status)) {
		return nil // nothing changes: a done record's late, stale update
	}
	// The same id and key: the record changes in place, as put would
	// leave it but for its ref.
	*j.slots.at(sl) = j.slotOf(&r)
	j.live += r.size() - before
	j.enqueue(op{kind: opUpsert, r: r}, false)
	return nil
}

// applyUpdate applies an update of state, attempts and status to r, the
// record with the update's key, and reports whether r changed. Done is
// final: a done record keeps its state and status whatever a later update
// says (a stale writer must not undo a recorded outcome), and attempts
// never go down. Replay applies the same rule to the upserts it reads, so a
// stale frame written after a done one cannot undo it on restart either.
func applyUpdate(r *rec, state journal.State, attempts uint32, status uint16) bool {
	old := *r
	if r.state != journal.StateDone {
		r.state, r.status = state, status
	}
	r.attempts = max(r.attempts, attempts)
	return *r != old
}

// hasKey reports whether the record sl of id has the given key, compared
// in storage form: a canonical UUID as 16 bytes, any other key as is.
// Callers hold mu.
func (j *Journal) hasKey(id string, h *ref, key string) bool {
	sl := j.slots.at(*h)
	var k [16]byte
	if parseUUID(key, &k) {
		return !sl.custom() && sl.key == k
	}
	return sl.custom() && j.custom[id] == key
}

// sameKey reports whether the record sl has r's key. Callers hold mu.
func (j *Journal) sameKey(h *ref, r *rec) bool {
	sl := j.slots.at(*h)
	if r.custom != "" {
		return sl.custom() && j.custom[r.id] == r.custom
	}
	return !sl.custom() && sl.key == r.key
}

// remove drops id from the index and queues its delete, recording the
// batch in deleting until it is synced. Callers hold mu.
func (j *Journal) remove(id string, durable bool) *batch {
	j.del(id)
	b := j.enqueue(op{kind: opDelete, r: rec{id: id}}, durable)
	j.deleting[id] = b
	b.dels = append(b.dels, id)
	return b
}

// Forget implements journal.Journal: it removes an action's record and
// returns once the removal is synced. With WithHashedIDs it accepts the
// original id or the digest form that Unfinished returns, as Reserve and
// Update do. An already-ended ctx is refused before anything changes.
// Forgetting an absent action returns at once, unless an earlier removal
// of it (another Forget, or Open or Reserve dropping it as expired) is
// still queued or being written: then Forget waits for that removal to be
// synced too. If the write fails, Forget returns an error wrapping
// journal.ErrUnavailable; the record stays removed, and its removal is
// written with a later batch (see Journal).
func (j *Journal) Forget(ctx context.Context, actionID string) error {
	if err := j.forget(ctx, j.storedID(actionID)); err != nil {
		return wrap(err, "forget %q", actionID) // see Reserve
	}
	return nil
}

func (j *Journal) forget(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return err
	}
	delete(j.damaged, id)
	var b *batch
	if _, ok := j.m[id]; ok {
		b = j.remove(id, true)
	} else if b = j.deleting[id]; b == nil {
		j.mu.Unlock()
		return nil
	} else if b == j.cur && !j.durable {
		// A lazy delete (of an expired record) still queued: write it now.
		j.durable = true
		j.signal()
	}
	j.mu.Unlock()
	return j.wait(ctx, b)
}

// Get implements journal.Getter: the record of actionID (as given, or in
// the digest form Unfinished reports with WithHashedIDs), or false if there
// is none or it has expired. It never waits for I/O.
func (j *Journal) Get(ctx context.Context, actionID string) (journal.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return journal.Record{}, false, wrap(err, "get %q", actionID)
	}
	id := j.storedID(actionID)
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.usable(); err != nil {
		return journal.Record{}, false, wrap(err, "get %q", actionID)
	}
	if err := j.damaged[id]; err != nil {
		return journal.Record{}, false, wrap(err, "get %q", actionID)
	}
	sl, ok := j.m[id]
	if !ok || j.expired(&sl, j.now()) {
		return journal.Record{}, false, nil
	}
	r := j.recOf(id, &sl)
	return r.record(actionID), true, nil
}

// Unfinished implements journal.Journal: the pending and unknown records,
// oldest first (ties by reported id). With WithHashedIDs, each ActionID is
// in digest form (journal.Digest of the original id). Every record it
// holds was checked as Open read it: one that journal.CheckRecord refuses,
// or any damage to acknowledged data, fails Open with ErrCorrupt. After a
// salvage (WithSalvage), each action whose record a damaged frame held
// (CorruptionError.Actions, each id as its bytes read: a damaged id names
// no action a request can have) and that no intact frame holds under the same
// key (lost, or perhaps an older record of it) is left out of the list
// and named, beside it, in a *journal.CorruptRecordsError; Reserve and
// Get of it fail with journal.ErrCorruptRecord (it may have been sent
// under the lost key), until it is forgotten (Forget) or the Journal is
// closed. The journal the salvage rewrote no longer holds what was lost,
// so a later Open does not name these actions: the salvaging Open's
// Recovery and the file it copied aside do.
func (j *Journal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, wrap(err, "unfinished")
	}
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return nil, wrap(err, "unfinished")
	}
	var out []journal.Record
	for id, sl := range j.m {
		if st := j.slots.at(sl).state; (st == journal.StatePending || st == journal.StateUnknown) && j.damaged[id] == nil {
			r := j.recOf(id, &sl)
			out = append(out, r.record(j.reportedID(id)))
		}
	}
	var bad *journal.CorruptRecordsError
	if len(j.damaged) > 0 {
		bad = &journal.CorruptRecordsError{}
		for _, id := range slices.Sorted(maps.Keys(j.damaged)) {
			bad.IDs, bad.Errs = append(bad.IDs, j.reportedID(id)), append(bad.Errs, j.damaged[id])
		}
	}
	j.mu.Unlock()
	slices.SortFunc(out, func(a, b journal.Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ActionID, b.ActionID)
	})
	if bad != nil {
		return out, wrap(bad, "unfinished")
	}
	return out, nil
}

// Sync waits until every Update made so far is on disk (it makes the
// Journal a journal.Syncer): those still queued, and those of a batch the
// committer has taken but not yet synced. Batches are committed in order,
// so waiting for the queue's batch covers the one being written too. If
// the write fails, Sync returns an error wrapping journal.ErrUnavailable,
// and the updates stay queued, for a later batch (see Journal).
func (j *Journal) Sync(ctx context.Context) error {
	return wrap(j.sync(ctx), "sync")
}

func (j *Journal) sync(ctx context.Context) error {
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return err
	}
	if len(j.queue) == 0 {
		b := j.writing
		j.mu.Unlock()
		if b == nil {
			// Nothing to write: check that there is still a journal to
			// have written to (see present).
			err := j.presentWithin(ctx)
			if ctx.Err() != nil && err == ctx.Err() {
				return err // not a finding about the journal
			}
			if errors.Is(err, ErrRemoved) {
				j.mu.Lock()
				j.poisonLocked(err)
				err = j.usable()
				j.mu.Unlock()
			} else if err != nil {
				err = fmt.Errorf("%w: %w", journal.ErrUnavailable, err)
			}
			return err
		}
		return j.wait(ctx, b)
	}
	b := j.cur
	if !j.durable {
		j.durable = true
		j.signal()
	}
	j.mu.Unlock()
	return j.wait(ctx, b)
}

// presentWithin is present under identMu, for a caller whose wait ctx
// bounds: a compaction holds identMu from its rename until its new file is
// in use, a directory fsync included, which a stalled disk can make last.
// Then the check runs on a goroutine of its own, which ends with the
// compaction's step, and ctx's end returns ctx's error.
func (j *Journal) presentWithin(ctx context.Context) error {
	if j.identMu.TryLock() {
		defer j.identMu.Unlock()
		return j.present()
	}
	// One check waits at a time, shared by every Sync that comes
	// meanwhile: Syncs cut short by their contexts while a disk stalls
	// do not each leave a goroutine behind.
	j.checkMu.Lock()
	c := j.checking
	if c == nil {
		c = &presentCheck{done: make(chan struct{})}
		j.checking = c
		go func() {
			j.identMu.Lock()
			err := j.present()
			j.identMu.Unlock()
			j.checkMu.Lock()
			j.checking = nil
			j.checkMu.Unlock()
			c.err = err
			close(c.done)
		}()
	}
	j.checkMu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// presentCheck is a check of present waiting for identMu (see
// presentWithin): err is set before done is closed.
type presentCheck struct {
	done chan struct{}
	err  error
}

// Compact rewrites the journal now, without its forgotten and expired
// records (it also happens by itself when the file is mostly dead records,
// and at Open). Reserves wait while it runs.
func (j *Journal) Compact(ctx context.Context) error {
	return wrap(j.compactNow(ctx), "compact")
}

func (j *Journal) compactNow(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	reply := make(chan error, 1) // the committer never waits on it
	j.mu.Lock()
	if err := j.usable(); err != nil {
		j.mu.Unlock()
		return err
	}
	j.ev.compact = append(j.ev.compact, reply)
	j.mu.Unlock()
	j.signal()
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close implements journal.Journal: it writes and syncs the queued
// updates, stops the journal's goroutine, closes its file and releases its
// lock, even when that write fails. It returns the error of that last
// write (journal.ErrUnavailable and the cause: on a full disk, the queued
// updates are lost, and what was acknowledged is on disk), or the one that
// stopped the journal earlier (journal.ErrClosed); with the journal whole,
// an error naming
// fingerprint.key if it was deleted while the Journal was open and could
// not be made again (the next Open makes a new secret; that error does not
// wrap journal.ErrClosed). Later calls, concurrent ones included, wait
// until the journal is fully closed (the lock released) and return nil.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closing {
		j.mu.Unlock()
		<-j.closed
		return nil
	}
	j.closing = true
	j.ev.stop = true
	j.mu.Unlock()
	defer close(j.closed)
	j.signal()
	<-j.done
	err := j.closeErr
	if lerr := j.lock.Release(); err == nil && lerr != nil {
		err = fmt.Errorf("release lock: %w", lerr)
	}
	return wrap(err, "close")
}

var (
	_ journal.Journal    = (*Journal)(nil)
	_ journal.Syncer     = (*Journal)(nil)
	_ journal.Timekeeper = (*Journal)(nil)
)
