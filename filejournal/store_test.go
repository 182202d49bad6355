package filejournal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/hammer"
	"github.com/idemretry/idemretry/journal"
)

func TestReopenKeepsRecords(t *testing.T) {
	base := runtime.NumGoroutine()
	dir := t.TempDir()
	s, rep := mustOpen(t, dir, testOpts())
	assert.Equal(t, 0, rep.Records)
	a := reserve(t, s, entry("a"))
	custom := entry("b")
	custom.Key = "order-42/attempt~1"
	b := reserve(t, s, custom)
	require.NoError(t, update(s, "a", a.Key, journal.StateDone, 3, 201))
	require.NoError(t, s.Close())
	waitGoroutines(t, base)

	s, rep = mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.Equal(t, 2, rep.Records)
	got, ok, err := s.get("a")
	require.NoError(t, err)
	require.True(t, ok)
	a.State, a.Attempts, a.Status = journal.StateDone, 3, 201
	assert.Equal(t, a, got)
	got, ok, _ = s.get("b")
	require.True(t, ok)
	assert.Equal(t, b, got)
	assert.Equal(t, "order-42/attempt~1", got.Key)

	fi, err := os.Stat(filepath.Join(dir, journalName))
	require.NoError(t, err)
	if runtime.GOOS != "windows" {
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		di, err := os.Stat(dir)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), di.Mode().Perm()&0o700)
	}
}

func TestInvalidRecords(t *testing.T) {
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	defer s.Close()
	ctx := context.Background()
	for name, e := range map[string]journal.Record{
		"empty id":    {Key: newKey(), State: journal.StatePending},
		"long id":     {ActionID: string(make([]byte, journal.MaxActionID+1)), Key: newKey(), State: journal.StatePending},
		"empty key":   {ActionID: "x", State: journal.StatePending},
		"space key":   {ActionID: "x", Key: "a b", State: journal.StatePending},
		"long key":    {ActionID: "x", Key: string(make([]byte, 256)), State: journal.StatePending},
		"zero state":  {ActionID: "x", Key: newKey()},
		"large state": {ActionID: "x", Key: newKey(), State: 9},
	} {
		_, _, err := s.Reserve(ctx, e, journal.ReuseAny)
		assert.ErrorIs(t, err, journal.ErrInvalidRecord, name)
	}
	// Uppercase UUIDs are valid keys, stored as strings so they read back
	// unchanged.
	e := entry("upper")
	e.Key = "8E03978E-40D5-43E8-BC93-6894A57F9324"
	assert.Equal(t, e.Key, reserve(t, s, e).Key)
	assert.ErrorIs(t, update(s, "nope", keyOf(t, s, "nope"), journal.StateDone, 1, 200), journal.ErrNotFound)
}

func TestConcurrentReserveOneKey(t *testing.T) {
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	defer s.Close()
	var wg sync.WaitGroup
	keys := make([]string, 100)
	created := make([]bool, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, c, err := s.Reserve(context.Background(), entry("same"), journal.ReuseAny)
			assert.NoError(t, err)
			keys[i], created[i] = got.Key, c
		}()
	}
	wg.Wait()
	n := 0
	for i := range keys {
		assert.Equal(t, keys[0], keys[i])
		if created[i] {
			n++
		}
	}
	assert.Equal(t, 1, n)
}

func TestGroupCommitManyCreators(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	hammer.Run(64, 20, func(g, i int) {
		_, _, err := s.Reserve(context.Background(), entry(fmt.Sprintf("g%d-%d", g, i)), journal.ReuseAny)
		assert.NoError(t, err)
	})
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	frames := len(frameOffsets(t, data))
	t.Logf("1280 records in %d frames", frames)
	assert.Less(t, frames, 1280, "no batching happened")
	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.Equal(t, 1280, rep.Records)
}

func TestSecondOpenInProcessIsLocked(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	requireLocked(t, dir, 50*time.Millisecond)
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	require.NoError(t, s.Close())
}

func TestClosedStore(t *testing.T) {
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, _, err := s.Reserve(context.Background(), entry("a"), journal.ReuseAny)
	assert.ErrorIs(t, err, journal.ErrClosed)
	assert.ErrorIs(t, update(s, "a", keyOf(t, s, "a"), journal.StateDone, 1, 200), journal.ErrClosed)
	assert.ErrorIs(t, s.Forget(context.Background(), "a"), journal.ErrClosed)
	_, err = s.Unfinished(context.Background())
	assert.ErrorIs(t, err, journal.ErrClosed)
	assert.ErrorIs(t, s.Compact(context.Background()), journal.ErrClosed)
}

func TestForgetAndUnfinishedOrder(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	now := time.Now().UnixMilli()
	for i, id := range []string{"c", "a", "b", "d"} {
		e := entry(id)
		e.CreatedAt = time.UnixMilli(now + int64(i%2)) // c,b at now; a,d at now+1
		reserve(t, s, e)
	}
	require.NoError(t, update(s, "d", keyOf(t, s, "d"), journal.StateDone, 1, 200))
	require.NoError(t, update(s, "b", keyOf(t, s, "b"), journal.StateUnknown, 6, 0))
	require.NoError(t, s.Forget(context.Background(), "c"))
	require.NoError(t, s.Forget(context.Background(), "never"))
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	un, err := s.Unfinished(context.Background())
	require.NoError(t, err)
	var ids []string
	for _, e := range un {
		ids = append(ids, e.ActionID)
	}
	assert.Equal(t, []string{"b", "a"}, ids)
}

func TestLazyUpdateFlushedByTimer(t *testing.T) {
	s, _ := openFlushing(t, 20*time.Millisecond)
	reserve(t, s, entry("a"))
	before := s.stats().FileBytes
	require.NoError(t, update(s, "a", keyOf(t, s, "a"), journal.StateDone, 1, 200))
	require.Eventually(t, func() bool { return s.stats().FileBytes > before }, 2*time.Second, 5*time.Millisecond)
	require.NoError(t, s.Close())
}

func TestCompactionShrinksAndKeeps(t *testing.T) {
	dir := t.TempDir()
	o := testOpts()
	o.compactMin = 4096
	s, _ := mustOpen(t, dir, o)
	for i := range 20 {
		reserve(t, s, entry(fmt.Sprintf("a%d", i)))
	}
	for round := range 100 {
		for i := range 20 {
			require.NoError(t, update(s, fmt.Sprintf("a%d", i), keyOf(t, s, fmt.Sprintf("a%d", i)), journal.StatePending, uint32(round), 0))
		}
		require.NoError(t, s.Sync(context.Background()))
	}
	st := s.stats()
	assert.Less(t, st.FileBytes, 3*st.LiveBytes+4096+1024, "automatic compaction did not run")
	require.NoError(t, s.Close())
	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	assert.Equal(t, 20, rep.Records)
	e, ok, _ := s.get("a7")
	require.True(t, ok)
	assert.Equal(t, 99, e.Attempts)
}

// T11: a sync failure poisons the descriptor, not the Journal (which, until
// issue 30, item 4, stayed failed until reopened): the batch is refused,
// and the next one reopens the file, cuts it back to its last synced frame
// and goes on, with nothing of the failed batch in the file.
func TestSyncErrorFailsTheBatchAlone(t *testing.T) { // T11
	dir := t.TempDir()
	errEIO := errors.New("injected EIO")
	s, fail := openFaulty(t, dir)
	a := reserve(t, s, entry("a"))
	fail.Store("sync", errEIO)
	_, _, err := s.Reserve(context.Background(), entry("b"), journal.ReuseAny)
	require.ErrorIs(t, err, errEIO)
	require.ErrorIs(t, err, journal.ErrUnavailable)
	_, _, err = s.Reserve(context.Background(), entry("b"), journal.ReuseAny)
	require.ErrorIs(t, err, errEIO, "refused again while syncs fail")
	fail.Delete("sync")
	c := reserve(t, s, entry("c"))
	_, ok, err := s.get("b")
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.False(t, rep.TornTail, "the failed batches' frames were left in the file")
	for _, want := range []journal.Record{a, c} {
		got, ok, err := s.get(want.ActionID)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, want.Key, got.Key)
	}
	_, ok, _ = s.get("b")
	assert.False(t, ok, "a refused Reserve is in the file")
	reserve(t, s, entry("d"))
}

// T12, write side: a write cut short by a full disk refuses its Reserve;
// Close, with nothing left to write, succeeds and cuts off the half frame
// (which until issue 30, item 4 was left to Open as a torn tail, Close
// failing); the refused record is not in the file.
func TestDiskFullMidFrame(t *testing.T) { // T12, write side
	dir := t.TempDir()
	s, fail := openFaulty(t, dir)
	a := reserve(t, s, entry("a"))
	fail.Store("short", true)
	_, _, err := s.Reserve(context.Background(), entry("b"), journal.ReuseAny)
	require.ErrorIs(t, err, errNoSpace)
	require.ErrorIs(t, err, journal.ErrUnavailable)
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.False(t, rep.TornTail)
	got, ok, _ := s.get("a")
	require.True(t, ok)
	assert.Equal(t, a.Key, got.Key)
	_, ok, _ = s.get("b")
	assert.False(t, ok)
}

func TestDiskFullMidCompaction(t *testing.T) { // T12, compaction side
	dir := t.TempDir()
	s, fail := openFaulty(t, dir)
	a := reserve(t, s, entry("a"))
	fail.Store("short:"+tmpName, true)
	err := s.Compact(context.Background())
	require.ErrorIs(t, err, errNoSpace)
	require.ErrorIs(t, err, journal.ErrUnavailable)
	// A failure before the rename leaves the journal working.
	fail.Delete("short:" + tmpName)
	b := reserve(t, s, entry("b"))
	require.NoError(t, s.Close())
	_, err = os.Stat(filepath.Join(dir, tmpName))
	assert.ErrorIs(t, err, os.ErrNotExist)
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	for _, e := range []journal.Record{a, b} {
		got, ok, _ := s.get(e.ActionID)
		require.True(t, ok)
		assert.Equal(t, e.Key, got.Key)
	}
}

var errNoSpace = errors.New("injected ENOSPC")

// faultyFile injects failures selected by keys of fail: "sync" (an error to
// return from Sync), "short" or "short:<name>" (write half, then ENOSPC).
type faultyFile struct {
	file
	fail *sync.Map
	name string
}

func (f *faultyFile) Write(p []byte) (int, error) {
	_, a := f.fail.Load("short")
	_, b := f.fail.Load("short:" + f.name)
	if a || b {
		n, _ := f.file.Write(p[:len(p)/2])
		return n, errNoSpace
	}
	return f.file.Write(p)
}

func (f *faultyFile) Sync() error {
	if err, ok := f.fail.Load("sync"); ok {
		return err.(error)
	}
	return f.file.Sync()
}

// Update must match the key as well as the id: a record replaced (done,
// then reserved anew with reusePending) or forgotten and created again is
// another action, which an update meant for the old one must not touch.
func TestUpdateChecksKey(t *testing.T) {
	for _, custom := range []bool{false, true} {
		s, _ := mustOpen(t, t.TempDir(), testOpts())
		mk := func(id string) journal.Record {
			e := entry(id)
			if custom {
				e.Key = "custom-" + newKey()
			}
			return e
		}
		old := reserve(t, s, mk("a"))
		require.NoError(t, update(s, "a", old.Key, journal.StateDone, 1, 200))
		repl, created, err := s.Reserve(context.Background(), mk("a"), journal.ReusePending)
		require.NoError(t, err)
		require.True(t, created)
		assert.ErrorIs(t, update(s, "a", old.Key, journal.StateUnknown, 9, 0), journal.ErrNotFound)
		got, ok, _ := s.get("a")
		require.True(t, ok)
		assert.Equal(t, repl, got, "replaced record untouched")

		require.NoError(t, s.Forget(context.Background(), "a"))
		again := reserve(t, s, mk("a"))
		assert.ErrorIs(t, update(s, "a", repl.Key, journal.StateDone, 3, 201), journal.ErrNotFound)
		assert.ErrorIs(t, update(s, "a", "", journal.StateDone, 3, 201), journal.ErrNotFound)
		got, _, _ = s.get("a")
		assert.Equal(t, again, got, "recreated record untouched")
		require.NoError(t, update(s, "a", again.Key, journal.StateDone, 3, 201))
		got, _, _ = s.get("a")
		assert.Equal(t, journal.StateDone, got.State)
		require.NoError(t, s.Close())
	}
}

// Every Close, not only the first, returns only once the Journal is closed:
// the final flush done and the lock released. A concurrent second Close
// used to return nil at once.
func TestConcurrentCloseWaits(t *testing.T) {
	dir := t.TempDir()
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	var armed atomic.Bool
	o := testOpts()
	o.hooks = &hooks{failpoint: func(name string) {
		if name == fpAfterWrite && armed.Load() {
			select {
			case entered <- struct{}{}:
				<-block
			default:
			}
		}
	}}
	s, _ := mustOpen(t, dir, o)
	a := reserve(t, s, entry("a"))
	require.NoError(t, update(s, "a", a.Key, journal.StateDone, 1, 200)) // flushed by Close
	armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- s.Close() }()
	<-entered // the first Close is flushing
	second := make(chan error, 1)
	go func() { second <- s.Close() }()
	select {
	case err := <-second:
		close(block)
		<-first
		t.Fatalf("second Close returned (%v) before the Journal was closed", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(block)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	// Closed means unlocked: the directory opens at once.
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	got, ok, _ := s.get("a")
	require.True(t, ok)
	assert.Equal(t, journal.StateDone, got.State)
}
