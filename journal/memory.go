package journal

import (
	"context"
	"crypto/rand"
	"fmt"
	"hash/maphash"
	"io"
	"math"
	"sort"
	"sync"
	"time"
)

// Memory is a Journal that keeps records in memory only. Keys survive
// retries and goroutines but not a restart of the process: use it in tests,
// or for actions whose outcome an application can always check. It is safe
// for concurrent use, and its calls never block (see NonBlocker).
//
// A done record is dropped once its retention (the key window plus the
// grace, DefaultRetention unless WithKeyWindow or WithGrace says otherwise)
// has passed since it was reserved, measured on the
// monotonic clock of this process, so a wall clock set forward cannot make
// it vanish early. Pending and outcome-unknown records are kept until
// Forget. Expired records are swept as new ones are reserved, so memory
// stays bounded by the actions of one retention period.
type Memory struct {
	mu     sync.Mutex
	closed bool

	// The records are kept where the garbage collector has next to nothing
	// to scan, however many a retention period holds: records indexes them
	// by a hash of their action id; pages hold them, without pointers but
	// for CreatedAt's Location (so that CreatedAt is returned exactly as it
	// was given); text holds their ids and keys. Both grow by whole pages
	// and chunks, never by copying what they hold.
	seed maphash.Seed
	// secret is FingerprintSecret's, set by NewMemory, never changed.
	secret    [32]byte
	hasSecret bool
	mask      uint64            // of the hashes; tests narrow it to make ids collide
	records   map[uint64]uint32 // hash of an action id -> 1 + the index of the first entry of its chain
	pages     []*memPage
	n         int      // entries made: pages hold entries 0 to n-1
	free      []uint32 // indexes of unused entries below n
	text      [][]byte // chunks of textChunk bytes (or one id and key, if longer)
	dead      int      // bytes of text that no entry uses
	size      int      // bytes of text

	// keyWindow and grace are what the options set; retention, their sum,
	// is how long after it was reserved a done record is kept.
	keyWindow time.Duration
	grace     time.Duration
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
	chunk    uint32 // of text holding the action id, at pos; the key follows it
	pos      uint32
	idLen    uint32
	keyLen   uint32
	next     uint32 // 1 + the index of the next entry whose id has the same hash, or 0
	state    State
	form     KeyForm
	used     bool // false for an entry on the free list
}

const (
	pageSize  = 256      // entries per page
	textChunk = 32 << 10 // bytes per chunk of text
)

// memPage holds entries i*pageSize to (i+1)*pageSize-1. created comes
// first: the garbage collector scans a page up to its last pointer (each
// CreatedAt's Location), and the entries after it, which hold none, are
// then not scanned.
type memPage struct {
	created [pageSize]time.Time
	e       [pageSize]memEntry
}

// NewMemory returns an empty Memory journal.
func NewMemory(opts ...MemoryOption) *Memory {
	j := &Memory{seed: maphash.MakeSeed(), mask: math.MaxUint64, records: make(map[uint64]uint32),
		keyWindow: DefaultKeyWindow, grace: DefaultGrace, now: time.Now}
	_, err := io.ReadFull(rand.Reader, j.secret[:])
	j.hasSecret = err == nil
	for _, o := range opts {
		if o != nil {
			o(j)
		}
	}
	j.retention = retention(j.keyWindow, j.grace)
	j.start = j.now()
	return j
}

// FingerprintSecret implements FingerprintKeeper: a secret drawn from
// crypto/rand when the Memory was made (ok is false if that failed), which
// never leaves the process; for other == this Memory only.
func (j *Memory) FingerprintSecret(other Journal) ([32]byte, bool) {
	if m, ok := other.(*Memory); !ok || m != j || j == nil || !j.hasSecret {
		return [32]byte{}, false
	}
	return j.secret, true
}

// NeverBlocks implements NonBlocker: a Memory call waits for nothing but
// the other calls' hold of its lock, which none keeps across a wait. It is
// true for j == this Memory only, never for a journal that embeds it.
func (j *Memory) NeverBlocks(other Journal) bool {
	m, ok := other.(*Memory)
	return ok && m == j
}

// at returns entry i and its CreatedAt.
func (j *Memory) at(i uint32) (*memEntry, *time.Time) {
	p := j.pages[i/pageSize]
	return &p.e[i%pageSize], &p.created[i%pageSize]
}

// id and key return an entry's action id and key, as bytes of text.
func (j *Memory) id(e *memEntry) []byte { return j.text[e.chunk][e.pos : e.pos+e.idLen] }
func (j *Memory) key(e *memEntry) []byte {
	return j.text[e.chunk][e.pos+e.idLen : e.pos+e.idLen+e.keyLen]
}

// hash returns the hash of action id that indexes its record;
// hashBytes is hash for an id in text (maphash hashes a string and its
// bytes alike).
func (j *Memory) hash(id string) uint64 { return maphash.String(j.seed, id) & j.mask }

func (j *Memory) hashBytes(id []byte) uint64 { return maphash.Bytes(j.seed, id) & j.mask }

// find returns the index of the entry of action id, or -1.
func (j *Memory) find(id string) int { return j.findHashed(id, j.hash(id)) }

// findHashed is find for an id whose hash is h.
func (j *Memory) findHashed(id string, h uint64) int {
	for i := j.records[h]; i != 0; {
		e, _ := j.at(i - 1)
		if string(j.id(e)) == id { // compiled without a conversion
			return int(i - 1)
		}
		i = e.next
	}
	return -1
}

// record returns entry i as a Record; actionID is its id, when the caller
// has it as a string already.
func (j *Memory) record(i int, actionID string) Record {
	e, created := j.at(uint32(i))
	if actionID == "" {
		actionID = string(j.id(e))
	}
	return Record{ActionID: actionID, Key: string(j.key(e)), KeyForm: e.form, Fingerprint: e.fp, CreatedAt: *created,
		State: e.state, Attempts: e.attempts, Status: e.status}
}

// addText stores an id and its key in j's text, and returns where.
func addText[T string | []byte](j *Memory, id, key T) (chunk, pos uint32) {
	need := len(id) + len(key)
	last := len(j.text) - 1
	if last < 0 || cap(j.text[last])-len(j.text[last]) < need {
		j.text = append(j.text, make([]byte, 0, max(textChunk, need)))
		last++
	}
	c := j.text[last]
	pos = uint32(len(c))
	j.text[last] = append(append(c, id...), key...)
	j.size += need
	return uint32(last), pos
}

// insert stores rec, reserved at added, as a new entry.
func (j *Memory) insert(rec Record, added time.Duration) {
	j.insertHashed(rec, added, j.hash(rec.ActionID))
}

// insertHashed is insert for a record whose action id's hash is h.
func (j *Memory) insertHashed(rec Record, added time.Duration, h uint64) {
	var i uint32
	if n := len(j.free); n > 0 {
		i = j.free[n-1]
		j.free = j.free[:n-1]
	} else {
		if j.n%pageSize == 0 && j.n/pageSize == len(j.pages) {
			j.pages = append(j.pages, new(memPage))
		}
		i = uint32(j.n)
		j.n++
	}
	e, created := j.at(i)
	*e = memEntry{fp: rec.Fingerprint, added: added, attempts: rec.Attempts, status: rec.Status,
		idLen: uint32(len(rec.ActionID)), keyLen: uint32(len(rec.Key)), next: j.records[h], state: rec.State, form: rec.KeyForm, used: true}
	e.chunk, e.pos = addText(j, rec.ActionID, rec.Key)
	*created = rec.CreatedAt
	j.records[h] = i + 1
}

// remove drops entry i.
func (j *Memory) remove(i int) {
	e, created := j.at(uint32(i))
	h := j.hashBytes(j.id(e))
	if head := j.records[h]; head == uint32(i+1) {
		if e.next == 0 {
			delete(j.records, h)
		} else {
			j.records[h] = e.next
		}
	} else {
		for p := head; p != 0; {
			pe, _ := j.at(p - 1)
			if pe.next == uint32(i+1) {
				pe.next = e.next
				break
			}
			p = pe.next
		}
	}
	j.dead += int(e.idLen) + int(e.keyLen)
	*e, *created = memEntry{}, time.Time{}
	j.free = append(j.free, uint32(i))
	if j.dead > textChunk && j.dead > j.size/2 {
		j.compactText()
	}
}

// compactText drops the bytes of text that no entry uses.
func (j *Memory) compactText() {
	old := j.text
	j.text, j.size, j.dead = nil, 0, 0
	for i := 0; i < j.n; i++ {
		if e, _ := j.at(uint32(i)); e.used {
			c := old[e.chunk][e.pos:]
			e.chunk, e.pos = addText(j, c[:e.idLen], c[e.idLen:e.idLen+e.keyLen])
		}
	}
}

// compact moves the entries in use to the front, when at most a quarter of
// them are, so that memory shrinks after a busy period expires.
func (j *Memory) compact() {
	live := j.n - len(j.free)
	if j.n < 4*pageSize || live > j.n/4 {
		return
	}
	pages, n, text := j.pages, j.n, j.text
	j.records, j.pages, j.n, j.free, j.text, j.size, j.dead = make(map[uint64]uint32, live), nil, 0, nil, nil, 0, 0
	for i := range n {
		p := pages[i/pageSize]
		e := &p.e[i%pageSize]
		if !e.used {
			continue
		}
		c := text[e.chunk][e.pos:]
		j.insert(Record{ActionID: string(c[:e.idLen]), Key: string(c[e.idLen : e.idLen+e.keyLen]), KeyForm: e.form, Fingerprint: e.fp,
			CreatedAt: p.created[i%pageSize], State: e.state, Attempts: e.attempts, Status: e.status}, e.added)
	}
}

// sweep drops expired done records, at most once per tenth of the
// retention.
func (j *Memory) sweep(now time.Duration) {
	if now-j.swept < j.retention/10 {
		return
	}
	j.swept = now
	for i := 0; i < j.n; i++ {
		if e, _ := j.at(uint32(i)); e.used && e.state == StateDone && now-e.added >= j.retention {
			j.remove(i)
		}
	}
	j.compact()
}

// Reserve implements Journal. It refuses a record that CheckRecord
// refuses, with ErrInvalidRecord, and returns no stored record that it
// refuses (ErrCorruptRecord instead): Memory keeps only what it was given,
// checked, but what it returns is checked again all the same, as every
// journal's read path is.
func (j *Memory) Reserve(ctx context.Context, rec Record, mode ReserveMode) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	if err := CheckRecord(rec); err != nil {
		return Record{}, false, fmt.Errorf("reserve: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return Record{}, false, ErrClosed
	}
	now := j.now().Sub(j.start)
	j.sweep(now)
	h := j.hash(rec.ActionID) // once, for the lookup and the insert
	if i := j.findHashed(rec.ActionID, h); i >= 0 {
		old, _ := j.at(uint32(i))
		if (mode == ReuseAny || old.state != StateDone) && (old.state != StateDone || now-old.added < j.retention) {
			return j.checked(i, rec.ActionID)
		}
		j.remove(i)
	}
	j.insertHashed(rec, now, h)
	return rec, true, nil
}

// Get implements Getter.
func (j *Memory) Get(ctx context.Context, actionID string) (Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, false, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return Record{}, false, ErrClosed
	}
	i := j.find(actionID)
	if i < 0 {
		return Record{}, false, nil
	}
	if e, _ := j.at(uint32(i)); e.state == StateDone && j.now().Sub(j.start)-e.added >= j.retention {
		return Record{}, false, nil // let go of, as Reserve would replace it
	}
	r, _, err := j.checked(i, actionID)
	return r, err == nil, err
}

// checked returns entry i as a Record (see record), or an error wrapping
// ErrCorruptRecord if CheckRecord refuses it.
func (j *Memory) checked(i int, actionID string) (Record, bool, error) {
	r := j.record(i, actionID)
	if err := CheckStored(r); err != nil {
		return Record{}, false, err
	}
	return r, false, nil
}

// Update implements Journal. It refuses, changing nothing, progress that
// CheckProgress refuses (ErrInvalidRecord).
func (j *Memory) Update(ctx context.Context, rec Record) error {
	if err := CheckProgress(rec); err != nil {
		return fmt.Errorf("update %q: %w", rec.ActionID, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	i := j.find(rec.ActionID)
	var old *memEntry
	if i >= 0 {
		old, _ = j.at(uint32(i))
	}
	if old == nil || string(j.key(old)) != rec.Key {
		// Another key means another action under the same id (replaced,
		// or forgotten and created again): not the one being updated.
		return fmt.Errorf("update %q: %w", rec.ActionID, ErrNotFound)
	}
	if old.state != StateDone { // done is final
		old.state, old.status = rec.State, rec.Status
	}
	old.attempts = max(old.attempts, rec.Attempts)
	return nil
}

// Unfinished implements Journal. A record it holds that CheckStored
// refuses (put there by a test: Memory stores none) is left out of the
// list and named, with the others, in a *CorruptRecordsError, in byte
// order of action id.
func (j *Memory) Unfinished(ctx context.Context) ([]Record, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, ErrClosed
	}
	var out []Record
	var bad []Record
	for i := 0; i < j.n; i++ {
		// Every record not done: one of a state no Journal writes
		// (CheckStored refuses it) may have been pending, and is named.
		if e, _ := j.at(uint32(i)); e.used && e.state != StateDone {
			r := j.record(i, "")
			if CheckStored(r) != nil {
				bad = append(bad, r)
				continue
			}
			out = append(out, r)
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if !out[a].CreatedAt.Equal(out[b].CreatedAt) {
			return out[a].CreatedAt.Before(out[b].CreatedAt)
		}
		return out[a].ActionID < out[b].ActionID
	})
	if len(bad) == 0 {
		return out, nil
	}
	sort.Slice(bad, func(a, b int) bool { return bad[a].ActionID < bad[b].ActionID })
	ce := &CorruptRecordsError{IDs: make([]string, len(bad)), Errs: make([]error, len(bad))}
	for i, r := range bad {
		ce.IDs[i], ce.Errs[i] = r.ActionID, CheckStored(r)
	}
	return out, ce
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
