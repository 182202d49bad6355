package sim

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// journalKind is which real journal a history runs on.
type journalKind uint8

const (
	memJournal journalKind = iota
	fileJournal
	sqlJournal
)

func (k journalKind) String() string {
	return [...]string{"memory", "file", "postgres"}[k]
}

// jfault is a fault the journal layer injects.
type jfault uint8

const (
	jfFailUpdate   jfault = iota // an Update fails, nothing stored
	jfSlowUpdate                 // an Update takes 270 ms (real), past OutcomeGrace
	jfFailSync                   // a Sync fails (the file journal)
	jfFullDisk                   // a Reserve and an Update fail with ENOSPC
	jfSlowReserve                // a Reserve takes 40 ms (real)
	jfDamagedKey                 // an existing record is read back with a damaged key ("", "a b")
	jfDamagedCount               // an existing record is read back with a count of attempts that cannot be stored
	nJFaults
)

var jfaultNames = [...]string{"fail-update", "slow-update", "fail-sync", "full-disk", "slow-reserve", "damaged-key", "damaged-count"}

func (f jfault) String() string { return jfaultNames[f] }

// errInjected is what a failed journal call returns.
var errInjected = errors.New("sim: injected journal failure")

// faultJournal is the journal layer between a Transport and its real
// journal: it fails, slows or damages calls when a fault is armed, refuses
// every call once its process is dead (a crashed process writes nothing),
// honours every call's context as the real journals do, and logs what it
// saw. It is wrapped in a type that has exactly the optional capabilities
// (journal.Syncer, Timekeeper, Leaser, FingerprintKeeper) of the journal
// beneath, so that the Transport treats it as it would the real one.
type faultJournal struct {
	inner journal.Journal
	p     *process
	r     *runner
	self  journal.Journal // the wrapper the Transport holds

	mu    sync.Mutex
	armed [nJFaults]int
}

func (f *faultJournal) take(k jfault) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed[k] > 0 {
		f.armed[k]--
		return true
	}
	return false
}

func (f *faultJournal) arm(k jfault, n int) {
	f.mu.Lock()
	f.armed[k] += n
	f.mu.Unlock()
}

func (f *faultJournal) gate(ctx context.Context) error {
	if f.p.dead.Load() {
		return fmt.Errorf("sim: the process is dead: %w", journal.ErrClosed)
	}
	return ctx.Err()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *faultJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if err := f.gate(ctx); err != nil {
		return journal.Record{}, false, err
	}
	if f.take(jfSlowReserve) {
		if err := sleepCtx(ctx, 40*time.Millisecond); err != nil {
			return journal.Record{}, false, err
		}
	}
	if f.take(jfFullDisk) {
		f.logReserve(ctx, rec, journal.Record{}, false, syscall.ENOSPC)
		return journal.Record{}, false, fmt.Errorf("sim: write journal: %w", syscall.ENOSPC)
	}
	got, created, err := f.inner.Reserve(ctx, rec, mode)
	f.logReserve(ctx, rec, got, created, err)
	if err == nil && f.p.dead.Load() {
		// Died during the call: whatever it stored, the caller never
		// learns of it.
		return journal.Record{}, false, fmt.Errorf("sim: the process is dead: %w", journal.ErrClosed)
	}
	if err == nil && !created {
		got = f.damage(got)
	}
	return got, created, err
}

// damage returns rec as a damaged or crafted row would read, if such a
// fault is armed.
func (f *faultJournal) damage(rec journal.Record) journal.Record {
	switch {
	case f.take(jfDamagedKey):
		rec.Key = []string{"", "a b"}[rand.IntN(2)]
		f.r.damaged.Store(true)
		f.r.damagedID.Store(rec.ActionID, true)
		f.r.rec.logf("journal: %s read back with key %q", rec.ActionID, rec.Key)
	case f.take(jfDamagedCount):
		rec.Attempts = []int{math.MaxInt32, -1}[rand.IntN(2)]
		f.r.damaged.Store(true)
		f.r.damagedID.Store(rec.ActionID, true)
		f.r.rec.logf("journal: %s read back with %d attempts", rec.ActionID, rec.Attempts)
	}
	return rec
}

func (f *faultJournal) logReserve(ctx context.Context, want, rec journal.Record, created bool, err error) {
	c := callOf(ctx)
	if c != nil {
		if err == nil && rec.Key != "" && (created || c.kind != callResume) {
			// Its creator, or, if no call was seen creating it (a Reserve
			// that stored the record and then failed), the first to find it.
			f.r.mintOf.LoadOrStore(rec.Key, c)
		}
		// A record of its own exists (or may: a Reserve cut short by its
		// context may have stored it); a refused one (a full disk) stores
		// none, and one found that another intent's call minted is not its
		// own (a deliberate repeat that found the first payment's record,
		// then refused as damaged, has no key yet).
		own := created
		if m, ok := f.r.mintOf.Load(rec.Key); err == nil && ok {
			own = own || m.(*call).intent == c.intent
		}
		if own || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			f.r.mu.Lock()
			if !c.intent.minted {
				c.intent.minted, c.intent.mintedAt = true, f.r.clk.trueSince()
			}
			f.r.mu.Unlock()
		}
	}
	f.r.rec.mu.Lock()
	id := rec.ActionID
	if id == "" {
		id = want.ActionID // a failed Reserve returns no record
	}
	f.r.rec.reserves = append(f.r.rec.reserves, reserveEvent{seq: f.r.rec.next(), proc: f.p, call: callOf(ctx), actionID: id,
		key: rec.Key, form: rec.KeyForm, wantKey: want.Key, created: created, createdAt: rec.CreatedAt, trueAt: f.r.clk.trueSince(), err: err})
	f.r.rec.mu.Unlock()
}

func (f *faultJournal) logWrite(ctx context.Context, ended bool, rec journal.Record, sync, injected bool, err error) {
	f.r.rec.mu.Lock()
	var left time.Duration
	dl, hasDL := ctx.Deadline()
	if hasDL {
		left = time.Until(dl)
	}
	f.r.rec.writes = append(f.r.rec.writes, writeEvent{seq: f.r.rec.next(), proc: f.p, call: callOf(ctx), rec: rec, sync: sync,
		injected: injected, err: err, ctxEndedAtEntry: ended, left: left, deadline: dl, hasDeadline: hasDL})
	f.r.rec.mu.Unlock()
}

func (f *faultJournal) Update(ctx context.Context, rec journal.Record) error {
	ended := ctx.Err() != nil
	if err := f.gate(ctx); err != nil {
		f.logWrite(ctx, ended, rec, false, false, err)
		return err
	}
	switch {
	case f.take(jfFailUpdate):
		f.logWrite(ctx, ended, rec, false, true, errInjected)
		return errInjected
	case f.take(jfFullDisk):
		err := fmt.Errorf("sim: write journal: %w", syscall.ENOSPC)
		f.logWrite(ctx, ended, rec, false, true, err)
		return err
	case f.take(jfSlowUpdate):
		if err := sleepCtx(ctx, 270*time.Millisecond); err != nil {
			f.logWrite(ctx, ended, rec, false, true, err)
			return err
		}
		err := f.inner.Update(ctx, rec)
		f.logWrite(ctx, ended, rec, false, true, err)
		return err
	}
	err := f.inner.Update(ctx, rec)
	f.logWrite(ctx, ended, rec, false, false, err)
	return err
}

func (f *faultJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	if err := f.gate(ctx); err != nil {
		return nil, err
	}
	recs, err := f.inner.Unfinished(ctx)
	for i := range recs {
		recs[i] = f.damage(recs[i])
	}
	return recs, err
}

func (f *faultJournal) Forget(ctx context.Context, actionID string) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	return f.inner.Forget(ctx, actionID)
}

func (f *faultJournal) Close() error { return nil } // the runner closes the real one

func (f *faultJournal) Get(ctx context.Context, actionID string) (journal.Record, bool, error) {
	if err := f.gate(ctx); err != nil {
		return journal.Record{}, false, err
	}
	rec, ok, err := f.inner.(journal.Getter).Get(ctx, actionID)
	if ok {
		rec = f.damage(rec)
	}
	return rec, ok, err
}

func (f *faultJournal) sync(ctx context.Context) error {
	ended := ctx.Err() != nil
	if err := f.gate(ctx); err != nil {
		f.logWrite(ctx, ended, journal.Record{}, true, false, err)
		return err
	}
	if f.take(jfFailSync) {
		f.logWrite(ctx, ended, journal.Record{}, true, true, errInjected)
		return errInjected
	}
	err := f.inner.(journal.Syncer).Sync(ctx)
	f.logWrite(ctx, ended, journal.Record{}, true, false, err)
	return err
}

func (f *faultJournal) fingerprintSecret(j journal.Journal) ([32]byte, bool) {
	if j != f.self {
		return [32]byte{}, false
	}
	return f.inner.(journal.FingerprintKeeper).FingerprintSecret(f.inner)
}

// The wrappers, one per set of capabilities.

// memFJ wraps journal.Memory: a Getter and FingerprintKeeper (its
// NonBlocker claim is not the wrapper's: the wrapper may stall).
type memFJ struct{ *faultJournal }

func (m *memFJ) FingerprintSecret(j journal.Journal) ([32]byte, bool) { return m.fingerprintSecret(j) }

// fileFJ wraps the file journal: a Getter, Syncer, Timekeeper and
// FingerprintKeeper.
type fileFJ struct{ *faultJournal }

func (m *fileFJ) FingerprintSecret(j journal.Journal) ([32]byte, bool) { return m.fingerprintSecret(j) }
func (m *fileFJ) Sync(ctx context.Context) error                       { return m.sync(ctx) }
func (m *fileFJ) Now() time.Time                                       { return m.inner.(journal.Timekeeper).Now() }

// sqlFJ wraps sqljournal: a Getter, Timekeeper and Leaser.
type sqlFJ struct{ *faultJournal }

func (m *sqlFJ) Now() time.Time { return m.inner.(journal.Timekeeper).Now() }
func (m *sqlFJ) Lease(ctx context.Context, actionID, holder string, ttl time.Duration) (bool, time.Time, error) {
	if err := m.gate(ctx); err != nil {
		return false, time.Time{}, err
	}
	return m.inner.(journal.Leaser).Lease(ctx, actionID, holder, ttl)
}
func (m *sqlFJ) Release(ctx context.Context, actionID, holder string) error {
	if m.p.dead.Load() {
		return journal.ErrClosed
	}
	return m.inner.(journal.Leaser).Release(ctx, actionID, holder)
}

var (
	_ journal.Getter            = (*memFJ)(nil)
	_ journal.FingerprintKeeper = (*memFJ)(nil)
	_ journal.Syncer            = (*fileFJ)(nil)
	_ journal.Timekeeper        = (*fileFJ)(nil)
	_ journal.Leaser            = (*sqlFJ)(nil)
	_ journal.Timekeeper        = (*sqlFJ)(nil)
)

// wrap returns the journal layer over inner for process p.
func wrap(kind journalKind, inner journal.Journal, p *process, r *runner) (*faultJournal, journal.Journal) {
	f := &faultJournal{inner: inner, p: p, r: r}
	switch kind {
	case fileJournal:
		f.self = &fileFJ{f}
	case sqlJournal:
		f.self = &sqlFJ{f}
	default:
		f.self = &memFJ{f}
	}
	return f, f.self
}

// store is a history's durable storage: what survives a crash.
type store struct {
	kind journalKind
	clk  *vclock
	// memory: one journal for the whole history (a crash loses the
	// process's Transport, its flights and the outcomes it held, not the
	// journal).
	mem *journal.Memory
	// file: the directory of the current generation, under root.
	root string
	gen  int
	dir  string
	// postgres: the table.
	db    *sql.DB
	table string
}

func (s *store) open(keyWindow time.Duration) (journal.Journal, error) {
	switch s.kind {
	case memJournal:
		if s.mem == nil {
			s.mem = journal.NewMemory(journal.WithClock(s.clk.TrueNow), journal.WithKeyWindow(keyWindow), journal.WithGrace(journal.DefaultRetention))
		}
		return s.mem, nil
	case fileJournal:
		if s.dir == "" {
			s.dir = filepath.Join(s.root, "gen0")
		}
		return filejournal.Open(s.dir, filejournal.WithClock(s.clk.Now), filejournal.WithKeyWindow(keyWindow))
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return sqljournal.Open(ctx, s.db, sqljournal.WithTable(s.table), sqljournal.WithKeyWindow(keyWindow))
	}
}

// crashCopy makes the next generation's directory from what the crashed
// process left on disk: its files as they are now (the page cache survives
// a process's death; what it had not written yet is lost with it).
func (s *store) crashCopy() error {
	if s.kind != fileJournal {
		return nil
	}
	s.gen++
	next := filepath.Join(s.root, fmt.Sprintf("gen%d", s.gen))
	if err := os.MkdirAll(next, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "LOCK" {
			continue
		}
		if err := copyFile(filepath.Join(s.dir, e.Name()), filepath.Join(next, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	s.dir = next
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (s *store) close() {
	if s.kind == sqlJournal && s.db != nil && s.table != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.db.ExecContext(ctx, `DROP TABLE IF EXISTS "`+s.table+`"`)
	}
	if s.root != "" {
		os.RemoveAll(s.root)
	}
}
