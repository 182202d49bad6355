package journal

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sort"
	"sync"
	"time"
)

// DefaultRetention is how long the journals of this module keep a done
// record: the default key window (24 h) plus a day of grace, so that a
// repeat within the window always finds its key.
const DefaultRetention = 48 * time.Hour

// Memory is a Journal that keeps records in memory only. Keys survive
// retries and goroutines but not a restart of the process: use it in tests,
// or for actions whose outcome an application can always check. It is safe
// for concurrent use, and its calls never block (see NonBlocker).
//
// A done record is dropped once its retention (DefaultRetention, or
// MemoryRetention) has passed since it was reserved, measured on the
// monotonic clock of this process, so a wall clock set forward cannot make
// it vanish early. Pending and outcome-unknown records are kept until
// Forget. Expired records are swept as new ones are reserved, so memory
// stays bounded by the actions of one retention period.
type Memory struct {
	mu     sync.Mutex
	closed bool

	// The records are kept where the garbage collector has next to nothing
	// to scan, however many a retention period holds: records indexes them
	// by a hash of their action id, and entries, text and created hold them
	// (ids and keys back to back in text). Only created, one time.Time per
	// entry, holds a pointer (its Location), so that CreatedAt is returned
	// exactly as it was given.
	seed    maphash.Seed
	mask    uint64            // of the hashes; tests narrow it to make ids collide
	records map[uint64]uint32 // hash of an action id -> 1 + the index of the first entry of its chain
	entries []memEntry
	created []time.Time // CreatedAt of entries[i]
	free    []uint32    // indexes of unused entries
	text    []byte
	dead    int // bytes of text that no entry uses

	retention time.Duration
	now       func() time.Time
	start     time.Time     // now() when the journal was made: added is measured from it
	swept     time.Duration // since start
}

// memEntry is one record, without pointers.
type memEntry struct {
	fp       Fingerprint
	added    time.Duration // when reserved, since Memory.start
	attempts int
	status   int
	off      int // of the action id in text; the key follows it
	idLen    uint32
	keyLen   uint32
	next     uint32 // 1 + the index of the next entry whose id has the same hash, or 0
	state    State
	used     bool // false for an entry on the free list
}

// A MemoryOption configures a Memory journal.
type MemoryOption func(*Memory)

// MemoryRetention sets how long a done record is kept (default
// DefaultRetention); it must be at least the Transport's key window, and
// positive (a zero or negative d keeps the default).
func MemoryRetention(d time.Duration) MemoryOption {
	return func(j *Memory) {
		if d > 0 {
			j.retention = d
		}
	}
}

// MemoryClock replaces time.Now, for tests and simulations.
func MemoryClock(now func() time.Time) MemoryOption {
	return func(j *Memory) {
		if now != nil {
			j.now = now
		}
	}
}

// NewMemory returns an empty Memory journal.
func NewMemory(opts ...MemoryOption) *Memory {
	j := &Memory{seed: maphash.MakeSeed(), mask: math.MaxUint64, records: make(map[uint64]uint32), retention: DefaultRetention, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(j)
		}
	}
	j.start = j.now()
	return j
}

// NeverBlocks implements NonBlocker: a Memory call waits for nothing but
// the other calls' hold of its lock, which none keeps across a wait. It is
// true for j == this Memory only, never for a journal that embeds it.
func (j *Memory) NeverBlocks(other Journal) bool {
	m, ok := other.(*Memory)
	return ok && m == j
}

// id and key return an entry's action id and key, as bytes of text.
func (j *Memory) id(e *memEntry) []byte { return j.text[e.off : e.off+int(e.idLen)] }
func (j *Memory) key(e *memEntry) []byte {
	start := e.off + int(e.idLen)
	return j.text[start : start+int(e.keyLen)]
}

// hash returns the hash of action id that indexes its record;
// hashBytes is hash for an id in text (maphash hashes a string and its
// bytes alike).
func (j *Memory) hash(id string) uint64 { return maphash.String(j.seed, id) & j.mask }

func (j *Memory) hashBytes(id []byte) uint64 { return maphash.Bytes(j.seed, id) & j.mask }

// find returns the index of the entry of action id, or -1.
func (j *Memory) find(id string) int {
	for i := j.records[j.hash(id)]; i != 0; i = j.entries[i-1].next {
		if e := &j.entries[i-1]; string(j.id(e)) == id { // compiled without a conversion
			return int(i - 1)
		}
	}
	return -1
}

// record returns entry i as a Record; actionID is its id, when the caller
// has it as a string already.
func (j *Memory) record(i int, actionID string) Record {
	e := &j.entries[i]
	if actionID == "" {
		actionID = string(j.id(e))
	}
	return Record{ActionID: actionID, Key: string(j.key(e)), Fingerprint: e.fp, CreatedAt: j.created[i],
		State: e.state, Attempts: e.attempts, Status: e.status}
}

// insert stores rec, reserved at added, as a new entry.
func (j *Memory) insert(rec Record, added time.Duration) {
	e := memEntry{fp: rec.Fingerprint, added: added, attempts: rec.Attempts, status: rec.Status, off: len(j.text),
		idLen: uint32(len(rec.ActionID)), keyLen: uint32(len(rec.Key)), state: rec.State, used: true}
	j.text = append(append(j.text, rec.ActionID...), rec.Key...)
	h := j.hash(rec.ActionID)
	e.next = j.records[h]
	var i int
	if n := len(j.free); n > 0 {
		i = int(j.free[n-1])
		j.free = j.free[:n-1]
		j.entries[i], j.created[i] = e, rec.CreatedAt
	} else {
		i = len(j.entries)
		j.entries = append(j.entries, e)
		j.created = append(j.created, rec.CreatedAt)
	}
	j.records[h] = uint32(i + 1)
}

// remove drops entry i.
func (j *Memory) remove(i int) {
	e := &j.entries[i]
	h := j.hashBytes(j.id(e))
	if head := j.records[h]; head == uint32(i+1) {
		if e.next == 0 {
			delete(j.records, h)
		} else {
			j.records[h] = e.next
		}
	} else {
		for p := head; p != 0; p = j.entries[p-1].next {
			if j.entries[p-1].next == uint32(i+1) {
				j.entries[p-1].next = e.next
				break
			}
		}
	}
	j.dead += int(e.idLen) + int(e.keyLen)
	*e, j.created[i] = memEntry{}, time.Time{}
	j.free = append(j.free, uint32(i))
	if j.dead > 64<<10 && j.dead > len(j.text)/2 {
		j.compactText()
	}
}

// compactText drops the bytes of text that no entry uses.
func (j *Memory) compactText() {
	text := make([]byte, 0, len(j.text)-j.dead)
	for i := range j.entries {
		e := &j.entries[i]
		if !e.used {
			continue
		}
		n := int(e.idLen) + int(e.keyLen)
		text = append(text, j.text[e.off:e.off+n]...)
		e.off = len(text) - n
	}
	j.text, j.dead = text, 0
}

// compact moves the entries in use to the front, when at most a quarter of
// them are, so that memory shrinks after a busy period expires.
func (j *Memory) compact() {
	live := len(j.entries) - len(j.free)
	if len(j.entries) < 1024 || live > len(j.entries)/4 {
		return
	}
	entries := make([]memEntry, 0, 2*live)
	created := make([]time.Time, 0, 2*live)
	text := make([]byte, 0, 2*(len(j.text)-j.dead))
	records := make(map[uint64]uint32, live)
	for i := range j.entries {
		e := j.entries[i]
		if !e.used {
			continue
		}
		id, key := j.id(&e), j.key(&e)
		e.off = len(text)
		text = append(append(text, id...), key...)
		h := j.hashBytes(id)
		e.next = records[h]
		entries = append(entries, e)
		created = append(created, j.created[i])
		records[h] = uint32(len(entries))
	}
	j.entries, j.created, j.text, j.records, j.free, j.dead = entries, created, text, records, nil, 0
}

// sweep drops expired done records, at most once per tenth of the
// retention.
func (j *Memory) sweep(now time.Duration) {
	if now-j.swept < j.retention/10 {
		return
	}
	j.swept = now
	for i := range j.entries {
		if e := &j.entries[i]; e.used && e.state == StateDone && now-e.added >= j.retention {
			j.remove(i)
		}
	}
	j.compact()
}

// Reserve implements Journal.
func (j *Memory) Reserve(ctx context.Context, rec Record, mode ReserveMode) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	if len(rec.ActionID) > math.MaxUint32/2 || len(rec.Key) > math.MaxUint32/2 {
		return Record{}, false, fmt.Errorf("%w: action id of %d bytes, key of %d", ErrInvalidRecord, len(rec.ActionID), len(rec.Key))
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return Record{}, false, ErrClosed
	}
	now := j.now().Sub(j.start)
	j.sweep(now)
	if i := j.find(rec.ActionID); i >= 0 {
		old := &j.entries[i]
		if (mode == ReuseAny || old.state != StateDone) && (old.state != StateDone || now-old.added < j.retention) {
			return j.record(i, rec.ActionID), false, nil
		}
		j.remove(i)
	}
	j.insert(rec, now)
	return rec, true, nil
}

// Update implements Journal.
func (j *Memory) Update(ctx context.Context, rec Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	i := j.find(rec.ActionID)
	if i < 0 || string(j.key(&j.entries[i])) != rec.Key {
		// Another key means another action under the same id (replaced,
		// or forgotten and created again): not the one being updated.
		return fmt.Errorf("update %q: %w", rec.ActionID, ErrNotFound)
	}
	old := &j.entries[i]
	if old.state != StateDone { // done is final
		old.state, old.status = rec.State, rec.Status
	}
	old.attempts = max(old.attempts, rec.Attempts)
	return nil
}

// Unfinished implements Journal.
func (j *Memory) Unfinished(ctx context.Context) ([]Record, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, ErrClosed
	}
	var out []Record
	for i := range j.entries {
		if e := &j.entries[i]; e.used && (e.state == StatePending || e.state == StateUnknown) {
			out = append(out, j.record(i, ""))
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if !out[a].CreatedAt.Equal(out[b].CreatedAt) {
			return out[a].CreatedAt.Before(out[b].CreatedAt)
		}
		return out[a].ActionID < out[b].ActionID
	})
	return out, nil
}

// Forget implements Journal.
func (j *Memory) Forget(ctx context.Context, actionID string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	if i := j.find(actionID); i >= 0 {
		j.remove(i)
	}
	return nil
}

// Close implements Journal. It is safe to call more than once.
func (j *Memory) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	return nil
}

var (
	_ Journal    = (*Memory)(nil)
	_ NonBlocker = (*Memory)(nil)
)
