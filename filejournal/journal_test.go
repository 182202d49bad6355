package filejournal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func jrec(id string) journal.Record {
	r := journal.Record{ActionID: id, Key: uuid.NewString(), CreatedAt: time.Now(), State: journal.StatePending}
	copy(r.Fingerprint[:], "fp-"+id)
	return r
}

func openJ(t *testing.T, dir string, opts ...Option) *Journal {
	t.Helper()
	j, err := Open(dir, opts...)
	require.NoError(t, err)
	return j
}

func TestFileJournalSurvivesReopen(t *testing.T) {
	base := runtime.NumGoroutine()
	dir := filepath.Join(t.TempDir(), "nested", "state")
	ctx := context.Background()
	j := openJ(t, dir)
	a, created, err := j.Reserve(ctx, jrec("pay-1"), journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	a.State, a.Attempts, a.Status = journal.StateDone, 2, 201
	require.NoError(t, j.Update(ctx, a))
	require.NoError(t, j.Close())
	waitGoroutines(t, base)

	j = openJ(t, dir)
	defer j.Close()
	assert.Equal(t, 1, j.Recovery().Records)
	got, created, err := j.Reserve(ctx, jrec("pay-1"), journal.ReuseAny)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, a.Key, got.Key)
	assert.Equal(t, journal.StateDone, got.State)
	assert.Equal(t, 201, got.Status)
	assert.Equal(t, a.CreatedAt.UnixMilli(), got.CreatedAt.UnixMilli())
	if runtime.GOOS != "windows" {
		fi, err := os.Stat(dir)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
		for _, name := range []string{"journal", "LOCK"} {
			fi, err := os.Stat(filepath.Join(dir, name))
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
		}
	}
}

func TestFileJournalHashedIDs(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	j := openJ(t, dir, WithHashedIDs())
	const id = "customer-jane.doe@example.com-order-17"
	r, _, err := j.Reserve(ctx, jrec(id), journal.ReuseAny)
	require.NoError(t, err)
	assert.Equal(t, id, r.ActionID)
	require.NoError(t, j.Sync(ctx))
	data, err := os.ReadFile(filepath.Join(dir, "journal"))
	require.NoError(t, err)
	assert.False(t, bytes.Contains(data, []byte(id)), "plain action id on disk")

	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	require.Len(t, un, 1)
	sum := sha256.Sum256([]byte(id))
	assert.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), un[0].ActionID)
	assert.Equal(t, r.Key, un[0].Key)
	require.NoError(t, j.Forget(ctx, un[0].ActionID))
	un, _ = j.Unfinished(ctx)
	assert.Empty(t, un)
	require.NoError(t, j.Close())

	_, err = Open(dir)
	assert.ErrorIs(t, err, journal.ErrIncompatible)
}

func TestFileJournalLocked(t *testing.T) {
	dir := t.TempDir()
	j := openJ(t, dir)
	_, err := Open(dir)
	assert.ErrorIs(t, err, ErrLocked)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = j.Close()
	}()
	j2, err := Open(dir, WithLockWait(10*time.Second))
	require.NoError(t, err)
	require.NoError(t, j2.Close())
}

func TestFileJournalCorruption(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	j := openJ(t, dir)
	var keys []string
	for _, id := range []string{"a", "b", "c", "d"} {
		r, _, err := j.Reserve(ctx, jrec(id), journal.ReuseAny)
		require.NoError(t, err)
		keys = append(keys, r.Key)
	}
	require.NoError(t, j.Close())
	path := filepath.Join(dir, "journal")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	// The frame holding "b" starts after the header, the empty snapshot's
	// end frame and the frame of "a"; damage a byte in its middle.
	i := bytes.Index(data, []byte{1, 2, 1, 'b'}) // an upsert (1) with its observed time (flag 2) of id "b"
	require.Positive(t, i)
	data[i+10] ^= 0x40
	require.NoError(t, os.WriteFile(path, data, 0o600))

	_, err = Open(dir)
	var ce *CorruptionError
	require.ErrorAs(t, err, &ce)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.Equal(t, path, ce.Path)
	assert.Positive(t, ce.Offset)

	j = openJ(t, dir, WithSalvage())
	defer j.Close()
	rec := j.Recovery()
	require.Len(t, rec.Salvaged, 1)
	assert.Equal(t, ce.Offset, rec.Salvaged[0].Offset)
	assert.FileExists(t, rec.CorruptCopy)
	for n, id := range []string{"a", "c", "d"} {
		got, created, err := j.Reserve(ctx, jrec(id), journal.ReuseAny)
		require.NoError(t, err)
		assert.False(t, created, id)
		assert.Equal(t, keys[[]int{0, 2, 3}[n]], got.Key)
	}
}

func TestFileJournalExpiry(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	ctx := context.Background()
	j := openJ(t, t.TempDir(), WithClock(clock), WithKeyWindow(30*time.Minute), WithGrace(30*time.Minute))
	defer j.Close()
	mk := func(id string, s journal.State) journal.Record {
		r := jrec(id)
		r.CreatedAt = now
		got, _, err := j.Reserve(ctx, r, journal.ReuseAny)
		require.NoError(t, err)
		got.State = s
		require.NoError(t, j.Update(ctx, got))
		return got
	}
	done, pending, unknown := mk("done", journal.StateDone), mk("pending", journal.StatePending), mk("unknown", journal.StateUnknown)
	mu.Lock()
	now = now.Add(100 * time.Hour)
	mu.Unlock()
	require.NoError(t, j.Compact(ctx))
	got, created, err := j.Reserve(ctx, jrec("done"), journal.ReuseAny)
	require.NoError(t, err)
	assert.True(t, created)
	assert.NotEqual(t, done.Key, got.Key)
	for _, r := range []journal.Record{pending, unknown} {
		got, created, err := j.Reserve(ctx, jrec(r.ActionID), journal.ReuseAny)
		require.NoError(t, err)
		assert.False(t, created, "%s expired", r.ActionID)
		assert.Equal(t, r.Key, got.Key)
	}
}

// A failed sync fails its batch alone (issue 30, item 4: it stopped the
// Journal until a reopen): the Reserve is refused with
// journal.ErrUnavailable and the sync's error, and leaves no record; the
// journal goes on serving what it holds, and once syncs work again the next
// Reserve succeeds.
func TestFileJournalSyncFailureFailsTheBatch(t *testing.T) {
	dir := t.TempDir()
	errEIO := errors.New("injected EIO")
	var failing sync.Map
	j := openJ(t, dir, withHooks(&hooks{wrapFile: func(name string, f file) file {
		return syncFailer{f, &failing}
	}}))
	ctx := context.Background()
	a, _, err := j.Reserve(ctx, jrec("a"), journal.ReuseAny)
	require.NoError(t, err)
	failing.Store(true, errEIO)
	b := jrec("b")
	_, _, err = j.Reserve(ctx, b, journal.ReuseAny)
	assert.ErrorIs(t, err, errEIO)
	assert.ErrorIs(t, err, journal.ErrUnavailable)
	assert.NotErrorIs(t, err, journal.ErrClosed)
	_, err = j.Unfinished(ctx)
	assert.NoError(t, err)
	_, found, err := j.Get(ctx, "b")
	require.NoError(t, err)
	assert.False(t, found, "the refused Reserve left its record")
	failing.Delete(true)
	got, created, err := j.Reserve(ctx, b, journal.ReuseAny)
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, b.Key, got.Key)
	require.NoError(t, j.Close())

	j = openJ(t, dir)
	defer j.Close()
	for _, want := range []journal.Record{a, b} {
		got, created, err := j.Reserve(ctx, jrec(want.ActionID), journal.ReuseAny)
		require.NoError(t, err)
		assert.False(t, created)
		assert.Equal(t, want.Key, got.Key)
	}
}

type syncFailer struct {
	file
	failing *sync.Map
}

func (f syncFailer) Sync() error {
	if err, ok := f.failing.Load(true); ok {
		return err.(error)
	}
	return f.file.Sync()
}

func TestFileJournalInvalidRecords(t *testing.T) {
	j := openJ(t, t.TempDir())
	defer j.Close()
	ctx := context.Background()
	bad := []journal.Record{
		func() journal.Record { r := jrec("a"); r.Attempts = -1; return r }(),
		func() journal.Record { r := jrec("a"); r.Status = 70000; return r }(),
		func() journal.Record { r := jrec(strings.Repeat("x", journal.MaxActionID+1)); return r }(),
		func() journal.Record { r := jrec("a"); r.Key = "has space"; return r }(),
		func() journal.Record { r := jrec("a"); r.State = 0; return r }(),
	}
	for i, r := range bad {
		_, _, err := j.Reserve(ctx, r, journal.ReuseAny)
		assert.ErrorIs(t, err, journal.ErrInvalidRecord, "case %d", i)
	}
}

func TestDefaultJournalDir(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("checks the Linux layout")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	name := strings.TrimSuffix(filepath.Base(exe), filepath.Ext(exe))

	t.Setenv("XDG_STATE_HOME", "/var/state-test")
	d, err := DefaultDir()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join("/var/state-test", "idemretry", name), d)

	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"", "relative/ignored"} {
		t.Setenv("XDG_STATE_HOME", v)
		d, err = DefaultDir()
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(home, ".local", "state", "idemretry", name), d)
	}
}

func TestFileJournalCompactsByItself(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	j := openJ(t, dir, withCompactMin(4096), WithFlushInterval(time.Millisecond))
	r, _, err := j.Reserve(ctx, jrec("a"), journal.ReuseAny)
	require.NoError(t, err)
	for i := range 2000 {
		r.Attempts = i
		require.NoError(t, j.Update(ctx, r))
		if i%10 == 0 {
			require.NoError(t, j.Sync(ctx))
		}
	}
	require.NoError(t, j.Close())
	fi, err := os.Stat(filepath.Join(dir, "journal"))
	require.NoError(t, err)
	assert.Less(t, fi.Size(), int64(3*4096), "the journal grew without compaction")
	j = openJ(t, dir)
	defer j.Close()
	got, _, err := j.Reserve(ctx, jrec("a"), journal.ReuseAny)
	require.NoError(t, err)
	assert.Equal(t, r.Key, got.Key)
	assert.Equal(t, 1999, got.Attempts)
}

// Journal.Now never runs backwards: records written at T+25h, then the
// clock set back 2h, and the same across a reopen.
func TestFileJournalNowNeverRunsBack(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := t0
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	set := func(t time.Time) { mu.Lock(); clock = t; mu.Unlock() }
	dir := t.TempDir()
	j := openJ(t, dir, WithClock(now))
	late := t0.Add(25 * time.Hour)
	set(late)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		r := jrec(id)
		r.CreatedAt = late
		_, _, err := j.Reserve(ctx, r, journal.ReuseAny)
		require.NoError(t, err)
	}
	set(late.Add(-2 * time.Hour))
	assert.False(t, j.Now().Before(late), "clock set back: %v", j.Now())
	require.NoError(t, j.Close())

	j = openJ(t, dir, WithClock(now))
	defer j.Close()
	assert.False(t, j.Now().Before(late), "after reopen: %v", j.Now())
	set(late.Add(time.Hour))
	assert.True(t, j.Now().Equal(late.Add(time.Hour)), "clock ahead again")
}

// A nil Option is no option, as for NewTransport.
func TestOpenJournalNilOption(t *testing.T) {
	var j *Journal
	var err error
	require.NotPanics(t, func() { j, err = Open(t.TempDir(), nil, WithHashedIDs(), nil) })
	require.NoError(t, err)
	defer j.Close()
	assert.True(t, j.opts.hashed, "the options around the nil one still apply")
}

// Update matches the key: an update meant for a record that was replaced
// (here, forgotten and created again) leaves the new record alone, also
// with hashed ids, and also after a reopen.
func TestFileJournalUpdateMatchesKey(t *testing.T) {
	for _, opts := range [][]Option{nil, {WithHashedIDs()}} {
		dir := t.TempDir()
		j := openJ(t, dir, opts...)
		ctx := context.Background()
		old := jrec("a")
		_, _, err := j.Reserve(ctx, old, journal.ReuseAny)
		require.NoError(t, err)
		require.NoError(t, j.Forget(ctx, "a"))
		again := jrec("a")
		_, _, err = j.Reserve(ctx, again, journal.ReuseAny)
		require.NoError(t, err)
		old.State, old.Status = journal.StateDone, 201
		assert.ErrorIs(t, j.Update(ctx, old), journal.ErrNotFound)
		require.NoError(t, j.Close())
		j = openJ(t, dir, opts...)
		got, created, err := j.Reserve(ctx, jrec("a"), journal.ReuseAny)
		require.NoError(t, err)
		assert.False(t, created)
		assert.Equal(t, again.Key, got.Key)
		assert.Equal(t, journal.StatePending, got.State)
		assert.ErrorIs(t, j.Update(ctx, old), journal.ErrNotFound)
		require.NoError(t, j.Close())
	}
}
