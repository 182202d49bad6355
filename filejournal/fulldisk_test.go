package filejournal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A full disk (doc.go, "A full disk"): real ENOSPC on a small tmpfs, and
// injected write and sync failures.

// reserveUntilFull reserves new actions named prefix0, prefix1, ... until
// one is refused, and returns the records acknowledged before, and the
// error. A full tmpfs still takes the writes that fit in the journal's
// last page: the first few batches after the disk filled may succeed.
func reserveUntilFull(t *testing.T, s *Journal, prefix string) ([]journal.Record, error) {
	t.Helper()
	var acked []journal.Record
	for i := range 1000 {
		r, _, err := s.Reserve(context.Background(), entry(fmt.Sprintf("%s%d", prefix, i)), journal.ReuseAny)
		if err != nil {
			return acked, err
		}
		acked = append(acked, r)
	}
	t.Fatal("the journal never filled the disk")
	return nil, nil
}

// reserveSome reserves n new actions named prefix0, prefix1, ...
func reserveSome(t *testing.T, s *Journal, prefix string, n int) []journal.Record {
	t.Helper()
	var rs []journal.Record
	for i := range n {
		rs = append(rs, reserve(t, s, entry(fmt.Sprintf("%s%d", prefix, i))))
	}
	return rs
}

// doneAll records each of rs done with status (lazily), in place: eight
// updates make a batch larger than any one Reserve's, so that a disk on
// which a Reserve was refused refuses it too, whatever room the journal's
// last page has left.
func doneAll(t *testing.T, s *Journal, rs []journal.Record, status int) {
	t.Helper()
	for i := range rs {
		rs[i].State, rs[i].Attempts, rs[i].Status = journal.StateDone, 2, status
		require.NoError(t, s.Update(context.Background(), rs[i]))
	}
}

// requireFullDiskError requires err to be what a call that must write
// returns while the disk is full: journal.ErrUnavailable and the file
// system's ENOSPC, not journal.ErrClosed (the Journal is not stopped).
func requireFullDiskError(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, journal.ErrUnavailable)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NotErrorIs(t, err, journal.ErrClosed)
}

// Issue 30, item 4: a full disk stopped the journal for good, until it was
// reopened, and lost the updates it had queued. Now, on a real full file
// system, a call that must write is refused with a typed error and leaves
// no record; what was acknowledged before stays, so do the queued updates;
// once there is room again, the next call succeeds, with no reopen, and
// Close loses nothing.
func TestFullDiskRecoversWhenSpaceReturns(t *testing.T) {
	t.Parallel()
	mnt := smallFSOf(t, "1m")
	dir := filepath.Join(mnt, "j")
	o := testOpts()
	o.flushEvery = time.Hour // the updates wait for a batch, or Close
	s, _ := mustOpen(t, dir, o)
	t.Cleanup(func() { _ = s.Close() }) // before the unmount, on a failure
	ctx := context.Background()
	a := reserve(t, s, entry("a"))
	a.State, a.Attempts, a.Status = journal.StateDone, 1, 201
	require.NoError(t, s.Update(ctx, a)) // lazy: queued
	us := reserveSome(t, s, "u", 8)

	fill(t, mnt)
	acked, err := reserveUntilFull(t, s, "full")
	requireFullDiskError(t, err)
	refused := fmt.Sprintf("full%d", len(acked))
	_, found, err := s.Get(ctx, refused)
	require.NoError(t, err)
	assert.False(t, found, "a refused Reserve left its record")
	// While the disk stays full: refused again, each time.
	for range 3 {
		_, _, err = s.Reserve(ctx, entry(refused), journal.ReuseAny)
		requireFullDiskError(t, err)
	}
	// Reads and lazy updates go on; Sync waits for the updates, and fails.
	got, found, err := s.Get(ctx, "a")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, journal.StateDone, got.State)
	doneAll(t, s, us, 200)
	requireFullDiskError(t, s.Sync(ctx))

	unfill(t, mnt)
	b := reserve(t, s, entry(refused)) // the next call succeeds
	require.NoError(t, s.Sync(ctx))
	c := reserve(t, s, entry("c"))
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.False(t, rep.TornTail, "a batch that failed left its frame: %+v", rep)
	for _, want := range append(append([]journal.Record{a, b, c}, us...), acked...) {
		got, ok, err := s.Get(ctx, want.ActionID)
		require.NoError(t, err)
		require.True(t, ok, "acknowledged %s lost", want.ActionID)
		assert.Equal(t, want.Key, got.Key, want.ActionID)
		assert.Equal(t, want.State, got.State, want.ActionID)
		assert.Equal(t, want.Status, got.Status, want.ActionID)
	}
}

// A Reserve refused by a failed write changes nothing, even when it was to
// replace a record (a done one, under ReusePending): the done record it
// would have replaced, acknowledged, is still there, in memory and after a
// reopen, and a later Reserve replaces it as it would have.
func TestFullDiskRefusedReplacementKeepsTheRecord(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, fail := openFaulty(t, dir)
	ctx := context.Background()
	a := reserve(t, s, entry("a"))
	a.State, a.Attempts, a.Status = journal.StateDone, 1, 201
	require.NoError(t, s.Update(ctx, a))
	require.NoError(t, s.Sync(ctx))

	fail.Store("short", true)
	_, _, err := s.Reserve(ctx, entry("a"), journal.ReusePending)
	require.ErrorIs(t, err, journal.ErrUnavailable)
	require.ErrorIs(t, err, errNoSpace)
	got, found, err := s.Get(ctx, "a")
	require.NoError(t, err)
	require.True(t, found, "the done record a refused Reserve was to replace is gone")
	assert.Equal(t, a, got)
	fail.Delete("short")
	require.NoError(t, s.Close())

	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	got, found, err = s.Get(ctx, "a")
	require.NoError(t, err)
	require.True(t, found, "the done record a refused Reserve was to replace is gone after a reopen")
	assert.Equal(t, a, got)
	again, created, err := s.Reserve(ctx, entry("a"), journal.ReusePending)
	require.NoError(t, err)
	assert.True(t, created)
	assert.NotEqual(t, a.Key, again.Key)
}

// envFullMnt is the tmpfs TestFullDiskChild fills.
const envFullMnt = "IDEMRETRY_FULL_MNT"

// TestFullDiskChild is the child of TestFullDiskThenKill; it does nothing
// in a normal run. It reserves a, records its done (lazy), fills the disk,
// reserves until refused ("sub id key" and "ack id key" for each
// acknowledged, "sub" said late: the refused one is never submitted), is refused
// twice more, updates the first record it got after the disk filled
// (lazy), says "full", and waits to be killed.
func TestFullDiskChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestFullDiskThenKill")
	}
	mnt := os.Getenv(envFullMnt)
	o := testOpts()
	o.flushEvery = time.Millisecond // the failed flushes are tried again and again
	c := openChild(os.Getenv(envDir), o)
	ctx := context.Background()
	a, _, err := c.Reserve(ctx, entry("a"), journal.ReuseAny)
	if err != nil {
		c.fail(err)
	}
	c.say("sub %s %s", a.ActionID, a.Key)
	c.say("ack %s %s", a.ActionID, a.Key)
	a.State, a.Attempts, a.Status = journal.StateDone, 1, 201
	if err := c.Update(ctx, a); err != nil {
		c.fail(err)
	}
	fill(t, mnt)
	acked, err := reserveUntilFull(t, c.Journal, "full")
	for _, r := range acked {
		c.say("sub %s %s", r.ActionID, r.Key)
		c.say("ack %s %s", r.ActionID, r.Key)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		c.fail(fmt.Errorf("want ENOSPC: %w", err))
	}
	for range 2 {
		if _, _, err := c.Reserve(ctx, entry("refused"), journal.ReuseAny); !errors.Is(err, syscall.ENOSPC) {
			c.fail(fmt.Errorf("want ENOSPC: %w", err))
		}
	}
	if len(acked) > 0 {
		d := acked[0]
		d.State, d.Attempts, d.Status = journal.StateDone, 1, 202
		if err := c.Update(ctx, d); err != nil {
			c.fail(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // a few failed flushes
	c.say("full")
	select {}
}

// A process SIGKILLed while its disk is full, with writes failing and
// being tried again: the journal opens on the still-full disk with every
// record it acknowledged, and without the ones it refused; once there is
// room, it is written to again.
func TestFullDiskThenKill(t *testing.T) {
	t.Parallel()
	mnt := smallFSOf(t, "1m")
	dir := filepath.Join(mnt, "j")
	cmd, out := childtest.Start(t, "TestFullDiskChild", envDir+"="+dir, envFullMnt+"="+mnt)
	ls, err := killAt(cmd, out, "full")
	require.NoError(t, err)
	o := newOracle()
	o.apply(t, ls)
	require.Contains(t, o.acked, "a")

	s, rep := mustOpen(t, dir, testOpts())
	assert.Equal(t, len(o.acked), rep.Records, "records: %+v", rep)
	o.check(t, s, 0)
	_, found, err := s.get("refused")
	require.NoError(t, err)
	assert.False(t, found, "a refused Reserve is in the file")
	require.NoError(t, s.Close())

	unfill(t, mnt)
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	o.check(t, s, 1)
	reserve(t, s, entry("refused"))
}

// indexRecords returns every record in s's index, by stored id.
func indexRecords(s *Journal) map[string]journal.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]journal.Record, len(s.m))
	for id, h := range s.m {
		r := s.recOf(id, &h)
		out[id] = r.record(id)
	}
	return out
}

// Writes and syncs that fail at random while workers create, replace,
// update and forget records on a few ids: once the faults stop, the index
// is what the file holds, so a reopen finds exactly the records the Journal
// held before Close, and every failed batch was undone consistently
// (refused creations gone, replaced records back, removals and updates
// kept).
func TestFullDiskRandomFailuresKeepIndexAndFile(t *testing.T) {
	t.Parallel()
	for round := range 4 {
		dir := t.TempDir()
		fail := new(sync.Map)
		o := testOpts()
		o.flushEvery = time.Millisecond
		o.compactMin = 2048
		o.hooks = faultyHooks(fail)
		s, _ := mustOpen(t, dir, o)
		ctx := context.Background()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var refused atomic.Int64
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				for {
					select {
					case <-stop:
						return
					default:
					}
					id := fmt.Sprintf("id%d", rng.IntN(12))
					switch rng.IntN(4) {
					case 0, 1:
						mode := journal.ReuseAny
						if rng.IntN(2) == 0 {
							mode = journal.ReusePending
						}
						r, _, err := s.Reserve(ctx, entry(id), mode)
						if err != nil {
							assert.ErrorIs(t, err, journal.ErrUnavailable)
							refused.Add(1)
							continue
						}
						r.Attempts = rng.IntN(5)
						if rng.IntN(2) == 0 {
							r.State, r.Status = journal.StateDone, 200+rng.IntN(3)
						}
						if err := s.Update(ctx, r); err != nil {
							assert.ErrorIs(t, err, journal.ErrNotFound) // forgotten or replaced meanwhile
						}
					case 2:
						if err := s.Forget(ctx, id); err != nil {
							assert.ErrorIs(t, err, journal.ErrUnavailable)
						}
					case 3:
						if err := s.Sync(ctx); err != nil {
							assert.ErrorIs(t, err, journal.ErrUnavailable)
						}
					}
				}
			}()
		}
		rng := rand.New(rand.NewPCG(uint64(round), 99))
		for range 40 {
			switch rng.IntN(3) {
			case 0:
				fail.Store("short:"+journalName, true)
			case 1:
				fail.Store("sync", errNoSpace)
			}
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			fail.Delete("short:" + journalName)
			fail.Delete("sync")
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		require.NoError(t, s.Sync(ctx))
		want := indexRecords(s)
		require.NoError(t, checkIndex(s))
		require.NoError(t, s.Close())
		s, _ = mustOpen(t, dir, testOpts())
		assert.Equal(t, want, indexRecords(s), "round %d: the file and the index disagree", round)
		require.NoError(t, s.Close())
		t.Logf("round %d: %d records, %d Reserves refused", round, len(want), refused.Load())
		require.Positive(t, refused.Load(), "no Reserve was refused: the test tested nothing")
	}
}

// The repair after a failed write opens the journal by its path: a file
// put there meanwhile (the journal replaced on disk) is not cut or written
// to, and the Journal stops with ErrRemoved, as at any other write.
func TestFullDiskRepairLeavesAReplacedJournalAlone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, fail := openFaulty(t, dir)
	defer s.Close()
	reserve(t, s, entry("a"))
	fail.Store("short", true)
	_, _, err := s.Reserve(context.Background(), entry("b"), journal.ReuseAny)
	require.ErrorIs(t, err, journal.ErrUnavailable)
	fail.Delete("short")

	other := []byte("another journal's bytes, not to be cut")
	tmp := filepath.Join(t.TempDir(), "other")
	require.NoError(t, os.WriteFile(tmp, other, 0o600))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, journalName)))
	_, _, err = s.Reserve(context.Background(), entry("c"), journal.ReuseAny)
	require.ErrorIs(t, err, ErrRemoved)
	require.ErrorIs(t, err, journal.ErrClosed)
	got, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	assert.Equal(t, other, got)
}

// writeCountdown fails the write after the next left ones, once armed, as
// a disk that fills in the middle of a batch (half written, ENOSPC).
type writeCountdown struct {
	file
	armed *atomic.Bool
	left  *atomic.Int64
}

func (f writeCountdown) Write(p []byte) (int, error) {
	if f.armed.Load() && f.left.Add(-1) < 0 {
		f.armed.Store(false)
		n, _ := f.file.Write(p[:len(p)/2])
		return n, errNoSpace
	}
	return f.file.Write(p)
}

// A batch too large for one frame whose second frame fails, its first,
// with the Reserve's record, already synced: the Reserve is refused, the
// repair cuts the synced frame off with the rest (nothing of the batch was
// acknowledged) at once, and the updates the batch carried are written
// again. A reopen finds exactly the index.
func TestFullDiskMidBatchAfterASyncedFrame(t *testing.T) {
	t.Parallel()
	var armed, holding atomic.Bool
	var left atomic.Int64
	held, release := make(chan struct{}), make(chan struct{})
	o := testOpts()
	o.flushEvery = time.Hour
	o.compactMin = 1 << 40 // no compaction to rewrite the file from the index
	o.hooks = &hooks{
		wrapFile: func(name string, f file) file {
			if name != journalName {
				return f
			}
			return writeCountdown{f, &armed, &left}
		},
		failpoint: func(name string) {
			if name == fpWake && holding.CompareAndSwap(true, false) {
				close(held)
				<-release
			}
		},
	}
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	ctx := context.Background()
	rs := reserveSome(t, s, "r", 100)
	before, err := os.Stat(filepath.Join(dir, journalName))
	require.NoError(t, err)
	// The Reserve first, then about 2.6 MiB of updates, all in one batch:
	// the committer is held until they are queued.
	holding.Store(true)
	refused := make(chan error, 1)
	go func() {
		_, _, err := s.Reserve(ctx, entry("refused"), journal.ReuseAny)
		refused <- err
	}()
	<-held
	for i := range 40000 {
		r := &rs[i%len(rs)]
		r.Attempts++
		require.NoError(t, s.Update(ctx, *r))
	}
	left.Store(1)
	armed.Store(true)
	close(release)
	err = <-refused
	require.ErrorIs(t, err, journal.ErrUnavailable)
	require.ErrorIs(t, err, errNoSpace)
	require.False(t, armed.Load(), "the second frame's write did not fail")
	after, err := os.Stat(filepath.Join(dir, journalName))
	require.NoError(t, err)
	assert.Equal(t, before.Size(), after.Size(), "the failed batch was not cut off at once")
	_, found, err := s.Get(ctx, "refused")
	require.NoError(t, err)
	require.False(t, found)
	require.NoError(t, s.Sync(ctx))
	want := indexRecords(s)
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.Equal(t, want, indexRecords(s), "the file and the index disagree")
	for _, r := range rs {
		got, ok, err := s.Get(ctx, r.ActionID)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, r.Attempts, got.Attempts, r.ActionID)
	}
}
