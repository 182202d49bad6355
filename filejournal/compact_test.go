package filejournal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// Tests of compaction (compact.go): churn with expiry, a rename that a
// power loss undoes, the directory replaced while a compaction runs.

// The concurrency part of hW2's review of the file journal: Reserve,
// Update, Sync and Forget at high concurrency, with compactions and expiry
// running all the time, against a per-id model.

// churnModel is what an id's owner knows of its record.
type churnModel struct {
	state    journal.State // 0: none
	key      string
	created  int64 // the record's CreatedAt, Unix ms (of the fake clock)
	attempts int
	hist     []string // what the owner did, for failure messages
}

// TestCompactChurnWithExpiry: 16 goroutines, each owning 4 ids,
// cycle them through Reserve (ReusePending, a fresh key each time),
// in-place Updates, a lazy or synced done, Gets and Forgets, while a fake
// clock runs 2 ms a call (retention 300 ms: done records expire by the
// clock and by the observed time as the run goes), the committer looks for
// expired records every millisecond and compacts past 4 KiB. After every
// call the owner checks what it must see: a pending record is there with
// its key (Reserve gives it back, never a new key); a done one is there,
// done, with its key and attempts, or absent only once its retention is
// over; a forgotten one is absent; an Update of a record the owner holds
// succeeds. Then the journal is closed and reopened, and checked the same
// way.
func TestCompactChurnWithExpiry(t *testing.T) {
	t.Parallel()
	const workers, idsEach, steps = 16, 4, 1000
	var clock atomic.Int64
	clock.Store(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	now := func() time.Time { return time.UnixMilli(clock.Add(2)) }
	o := testOpts()
	o.now, o.keyWindow, o.grace, o.retention = now, 300*time.Millisecond, 0, 300*time.Millisecond
	o.expiryEvery, o.compactMin, o.flushEvery = time.Millisecond, 4<<10, 2*time.Millisecond
	var compactions atomic.Int64
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpDirSynced {
			compactions.Add(1)
		}
	}}
	dir := t.TempDir()
	j, _ := mustOpen(t, dir, o)
	ctx := context.Background()
	ret := o.retention.Milliseconds()
	models := make([][]churnModel, workers)

	// check compares what the journal has of id with m. A retention is
	// judged over by the clock after the Get: the Get judged it no later.
	check := func(j *Journal, id string, m churnModel, what string) error {
		got, ok, err := j.Get(ctx, id)
		after := clock.Load()
		if err != nil {
			return fmt.Errorf("%s: get %s: %w", what, id, err)
		}
		switch {
		case m.state == 0 && ok:
			return fmt.Errorf("%s: %s is there (key %s, %v), forgotten or never made", what, id, got.Key, got.State)
		case m.state == 0:
			return nil
		case !ok && m.state == journal.StateDone && after-m.created > ret:
			return nil // expired
		case !ok:
			return fmt.Errorf("%s: %s (%v, key %s, made %d ms ago) lost; history %v", what, id, m.state, m.key, after-m.created, m.hist)
		case got.Key != m.key:
			return fmt.Errorf("%s: %s has key %s, want %s", what, id, got.Key, m.key)
		case m.state == journal.StateDone && got.State != journal.StateDone:
			return fmt.Errorf("%s: %s's done came back as %v", what, id, got.State)
		case got.Attempts < m.attempts:
			return fmt.Errorf("%s: %s has %d attempts, want at least %d", what, id, got.Attempts, m.attempts)
		}
		return nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := range workers {
		models[g] = make([]churnModel, idsEach)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 12))
			ms := models[g]
			fail := func(err error) { errs <- fmt.Errorf("worker %d: %w", g, err) }
			for s := range steps {
				i := rng.IntN(idsEach)
				id := fmt.Sprintf("w%d-%d", g, i)
				m := &ms[i]
				say := func(f string, a ...any) {
					m.hist = append(m.hist, fmt.Sprintf("@%d ", clock.Load())+fmt.Sprintf(f, a...))
				}
				switch op := rng.IntN(10); {
				case op < 4: // Reserve
					e := entry(id)
					e.CreatedAt = time.UnixMilli(clock.Load())
					got, created, err := j.Reserve(ctx, e, journal.ReusePending)
					if err != nil {
						fail(err)
						return
					}
					if m.state == journal.StatePending {
						if created || got.Key != m.key {
							fail(fmt.Errorf("step %d: Reserve of pending %s (key %s) gave key %s, created %v", s, id, m.key, got.Key, created))
							return
						}
						break
					}
					if !created || got.Key != e.Key {
						fail(fmt.Errorf("step %d: Reserve of %s (model %v) did not create it: key %s, created %v", s, id, m.state, got.Key, created))
						return
					}
					*m = churnModel{state: journal.StatePending, key: got.Key, created: e.CreatedAt.UnixMilli(), hist: m.hist}
					say("reserved %s", got.Key[:8])
				case op < 6 && m.state == journal.StatePending: // attempts
					m.attempts += 1 + rng.IntN(200)
					if err := update(j, id, m.key, journal.StatePending, uint32(m.attempts), 0); err != nil {
						fail(fmt.Errorf("step %d: update %s: %w", s, id, err))
						return
					}
				case op < 8 && m.state == journal.StatePending: // done, synced or not
					m.attempts++
					if err := update(j, id, m.key, journal.StateDone, uint32(m.attempts), 201); err != nil {
						fail(fmt.Errorf("step %d: done %s: %w", s, id, err))
						return
					}
					m.state = journal.StateDone
					say("done")
					if rng.IntN(2) == 0 {
						if err := j.Sync(ctx); err != nil {
							fail(err)
							return
						}
					}
				case op == 8 && m.state != 0:
					if err := j.Forget(ctx, id); err != nil {
						fail(err)
						return
					}
					*m = churnModel{hist: m.hist}
					say("forgotten")
				}
				if err := check(j, id, *m, fmt.Sprintf("step %d", s)); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := j.stats()
	require.NoError(t, j.Close())
	// Open made the journal with a compaction's steps; the run made more.
	require.Greater(t, compactions.Load(), int64(5), "compactions during the run")
	j, rep := mustOpen(t, dir, o)
	defer j.Close()
	for g, ms := range models {
		for i, m := range ms {
			require.NoError(t, check(j, fmt.Sprintf("w%d-%d", g, i), m, "after reopen"))
		}
	}
	require.NoError(t, checkIndex(j))
	t.Logf("%d compactions; before close: %+v; reopened: %d records, compacted %v", compactions.Load(), st, rep.Records, rep.Compacted)
}

// Model of a platform whose renames may not be durable (no directory sync,
// where datasync.Dir does nothing: see dirsync.go; before
// MOVEFILE_WRITE_THROUGH, Windows). After a compaction, acknowledged
// Reserves are appended to the new file. A power loss that does not keep
// the rename leaves the old journal under
// "journal" and the new file, holding those acknowledged records, under
// "journal.tmp". Open must adopt journal.tmp, whose base sequence is past
// journal's last one, not delete it (see the package doc, "journal.tmp at
// recovery"). (Found in review: the record was lost.)
func TestLostCompactionRenameKeepsAppends(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, compact := openKeepingOldJournal(t, dir)
	reserve(t, s, entry("before"))
	oldJournal := compact()
	acked := reserve(t, s, entry("after-compaction")) // durable per the contract
	require.NoError(t, s.Close())
	newJournal, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	require.NotNil(t, oldJournal)

	// Image without the durable rename: old name kept, new file under tmp.
	img := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(img, journalName), oldJournal, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(img, tmpName), newJournal, 0o600))
	requireRecovered(t, img, acked.ActionID)
}

// Same model, for the journal's creation: Open creates it as journal.tmp
// and renames it. If that rename is not durable but later appends (through
// the same handle) are, the disk holds only journal.tmp: a snapshot
// followed by batch frames. It is a complete snapshot even though it does
// not end with the end record, and Open must adopt it. (Found in review:
// Open deleted it and started an empty journal.)
func TestLostCreationRenameKeepsRecords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	acked := reserve(t, s, entry("first-payment"))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)

	img := t.TempDir() // the rename was lost: only the old name exists
	require.NoError(t, os.WriteFile(filepath.Join(img, tmpName), data, 0o600))
	requireRecovered(t, img, acked.ActionID)
}

// requireRecovered opens the disk image img and requires it to hold the
// acknowledged record id.
func requireRecovered(t *testing.T, img, id string) {
	t.Helper()
	s, rep := mustOpen(t, img, testOpts())
	defer s.Close()
	_, found, _ := s.get(id)
	require.True(t, found, "acknowledged record lost; report %+v", rep)
}

// Open creates missing directories, syncing the parent of each: a nested,
// not yet existing journal directory works and keeps its records.
func TestOpenCreatesNestedDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "a", "b", "journal")
	s, _ := mustOpen(t, dir, testOpts())
	e := reserve(t, s, entry("pay:1"))
	require.NoError(t, s.Close())
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.True(t, fi.IsDir())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	_, found, _ := s.get(e.ActionID)
	require.True(t, found)
}

// openKeepingOldJournal opens a journal in dir, and returns it with compact,
// which compacts it and returns what the file "journal" held when the
// compaction's journal.tmp was synced: what a crash losing the rename that
// followed leaves under that name.
func openKeepingOldJournal(t *testing.T, dir string) (*Journal, func() []byte) {
	t.Helper()
	var old []byte
	armed := false
	o := testOpts()
	o.hooks = &hooks{failpoint: func(fp string) {
		if armed && fp == fpTmpSynced {
			b, err := os.ReadFile(filepath.Join(dir, journalName))
			if err == nil {
				old = b
			}
		}
	}}
	s, _ := mustOpen(t, dir, o)
	return s, func() []byte {
		t.Helper()
		armed = true
		require.NoError(t, s.Compact(context.Background()))
		require.NotNil(t, old)
		return old
	}
}

// TestCompactDirectoryReplacedDuringIt: while a compaction writes and
// syncs journal.tmp, its directory is moved away and another Journal (as
// another process would) opens a new journal at the same path and
// acknowledges a record. The compaction must not touch that journal: its
// rename fails (journal.tmp is in the old directory), and the Journal
// must then stop (ErrRemoved), not reopen "journal" by its path, which
// now names the other journal's file, and append its own frames to it.
// Before the fix it did: its next Reserve was acknowledged into the other
// journal's file, which then failed to open (bytes that are no frame
// before the other Journal's later frame).
func TestCompactDirectoryReplacedDuringIt(t *testing.T) {
	t.Parallel()
	r := newReplacedDirRig(t, fpTmpSynced)
	j := r.j
	reserve(t, j, entry("mine"))
	r.armed.Store(true)
	ctx := context.Background()
	err := j.Compact(ctx)
	require.Error(t, err)
	require.NotNil(t, r.other, "the failpoint ran")

	_, _, err = j.Reserve(ctx, entry("mine-after"), journal.ReuseAny)
	require.ErrorIs(t, err, ErrRemoved, "a Reserve after the compaction whose directory was replaced")
	require.ErrorIs(t, err, journal.ErrClosed)
	require.ErrorIs(t, j.Close(), ErrRemoved)

	// The other journal goes on, and opens whole, as it wrote it.
	reserve(t, r.other, entry("theirs-2"))
	require.NoError(t, r.other.Close())
	again, rep := mustOpen(t, r.dir, testOpts())
	defer again.Close()
	require.False(t, rep.TornTail, "nothing but the other journal's frames in its file")
	got, ok, err := again.Get(ctx, "theirs")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, r.otherKey, got.Key)
	for _, id := range []string{"mine", "mine-after"} {
		_, ok, err := again.Get(ctx, id)
		require.NoError(t, err)
		require.False(t, ok, "%s is the moved journal's", id)
	}
}

// TestCompactDirectoryReplacedBeforeTempMade: the directory is replaced after
// the compaction's first check that the journal is there and before it
// makes journal.tmp, so that its journal.tmp is made in the other
// journal's directory. The check before the rename stops the Journal; the
// journal.tmp it made there must go with it: left, the other journal's
// next Open would take it for its own snapshot whose rename was lost (its
// base sequence is past the other journal's last frame) and adopt it,
// losing the other journal's records for this one's. The other Journal's
// own journal.tmp, made meanwhile, would not be touched: only the file
// this Journal made is removed.
func TestCompactDirectoryReplacedBeforeTempMade(t *testing.T) {
	t.Parallel()
	r := newReplacedDirRig(t, fpCompactBegin)
	j := r.j
	// Sequences past the other journal's, so that its Open would adopt
	// this one's snapshot.
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5", "m6"} {
		reserve(t, j, entry(id))
	}
	r.armed.Store(true)
	ctx := context.Background()
	require.ErrorIs(t, j.Compact(ctx), ErrRemoved)
	require.NotNil(t, r.other, "the failpoint ran")
	_, _, err := j.Reserve(ctx, entry("mine-after"), journal.ReuseAny)
	require.ErrorIs(t, err, ErrRemoved)
	require.ErrorIs(t, j.Close(), ErrRemoved)

	require.NoError(t, r.other.Close())
	again, rep := mustOpen(t, r.dir, testOpts())
	defer again.Close()
	require.False(t, rep.AdoptedTemp, "the other journal adopted the moved one's snapshot")
	got, ok, err := again.Get(ctx, "theirs")
	require.NoError(t, err)
	require.True(t, ok, "the other journal's record")
	require.Equal(t, r.otherKey, got.Key)
	_, ok, err = again.Get(ctx, "m1")
	require.NoError(t, err)
	require.False(t, ok)
}

// replacedDirRig is a Journal in root/j whose failpoint fp, once armed,
// moves the directory away and opens another Journal at its path, as
// another process would, which reserves "theirs".
type replacedDirRig struct {
	root, dir string
	j         *Journal
	armed     atomic.Bool
	other     *Journal
	otherKey  string
}

func newReplacedDirRig(t *testing.T, fp string) *replacedDirRig {
	r := &replacedDirRig{root: t.TempDir()}
	r.dir = filepath.Join(r.root, "j")
	var once sync.Once
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name != fp || !r.armed.Load() {
			return
		}
		once.Do(func() {
			require.NoError(t, os.Rename(r.dir, filepath.Join(r.root, "moved")))
			r.other, _ = mustOpen(t, r.dir, testOpts())
			r.otherKey = reserve(t, r.other, entry("theirs")).Key
		})
	}}
	r.j, _ = mustOpen(t, r.dir, o)
	return r
}
