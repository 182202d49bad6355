package filejournal_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// A bad option value is refused by Open with an error wrapping
// ErrInvalidOption, never clamped to a default, and nothing is created.
func TestBadOptionsRefused(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]filejournal.Option{
		"nil clock":          filejournal.WithClock(nil),
		"zero key window":    filejournal.WithKeyWindow(0),
		"negative window":    filejournal.WithKeyWindow(-time.Hour),
		"negative grace":     filejournal.WithGrace(-time.Second),
		"negative lock wait": filejournal.WithLockWait(-time.Second),
		"zero flush":         filejournal.WithFlushInterval(0),
		"negative flush":     filejournal.WithFlushInterval(-time.Second),
	} {
		dir := filepath.Join(t.TempDir(), "j")
		j, err := filejournal.Open(dir, o)
		if err == nil {
			j.Close()
		}
		require.Error(t, err, name)
		assert.ErrorIs(t, err, filejournal.ErrInvalidOption, name)
		assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), "%s: %v", name, err)
		assert.NoDirExists(t, dir, name)
	}
	// The bounds themselves are valid: no grace, no wait.
	j, err := filejournal.Open(t.TempDir(), filejournal.WithGrace(0), filejournal.WithLockWait(0))
	require.NoError(t, err)
	require.NoError(t, j.Close())
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func doneRecord(t *testing.T, j *filejournal.Journal, id string, created time.Time) journal.Record {
	t.Helper()
	ctx := context.Background()
	r := journal.Record{ActionID: id, Key: uuid.NewString(), CreatedAt: created, State: journal.StatePending}
	got, created2, err := j.Reserve(ctx, r, journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created2)
	got.State, got.Status = journal.StateDone, 201
	require.NoError(t, j.Update(ctx, got))
	return got
}

// kept reports whether id's record is still there, by Reserve (which
// creates a new record if not).
func kept(t *testing.T, j *filejournal.Journal, id string, now time.Time) bool {
	t.Helper()
	r := journal.Record{ActionID: id, Key: uuid.NewString(), CreatedAt: now, State: journal.StatePending}
	_, created, err := j.Reserve(context.Background(), r, journal.ReuseAny)
	require.NoError(t, err)
	return !created
}

// One bound: a done record is kept for the key window plus the grace, and
// the journal's clock mark is believed up to the grace ahead of the clock.
func TestKeyWindowAndGrace(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	j, err := filejournal.Open(t.TempDir(), filejournal.WithClock(clk.Now),
		filejournal.WithKeyWindow(time.Hour), filejournal.WithGrace(30*time.Minute))
	require.NoError(t, err)
	defer j.Close()
	for _, id := range []string{"a", "b1", "b2"} {
		doneRecord(t, j, id, t0)
	}

	clk.Set(t0.Add(89 * time.Minute))
	assert.True(t, kept(t, j, "a", clk.Now()), "expired inside window + grace")
	clk.Set(t0.Add(91 * time.Minute))
	assert.False(t, kept(t, j, "a", clk.Now()), "kept past window + grace")

	// The clock set back by less than the grace: the mark (t0+91m) is
	// believed, and b1 is expired by it. Set back by more: the mark is
	// not believed, and by the clock (t0+51m) b2 is inside its retention.
	clk.Set(t0.Add(70 * time.Minute))
	assert.False(t, kept(t, j, "b1", clk.Now()), "a clock set back 21 min (grace 30) kept a record longer")
	clk.Set(t0.Add(51 * time.Minute))
	assert.True(t, kept(t, j, "b2", clk.Now()), "a mark 40 min ahead (grace 30) believed")
}

// The lock error names the directory, who may hold it and what to do, with
// the "idemretry: " prefix once; on Unix, it names the holder's process.
func TestLockedErrorSaysWhoAndWhat(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	defer j.Close()
	_, err = filejournal.Open(dir)
	require.ErrorIs(t, err, filejournal.ErrLocked)
	msg := err.Error()
	assert.True(t, strings.HasPrefix(msg, "idemretry: journal locked: "+dir+" is held by another Client"), msg)
	assert.Equal(t, 1, strings.Count(msg, "idemretry: "), msg)
	assert.Contains(t, msg, "one Client per directory")
	assert.Contains(t, msg, "filejournal.WithLockWait")
	if runtime.GOOS != "windows" { // there, the locked file cannot be read
		assert.Contains(t, msg, "pid "+strconv.Itoa(os.Getpid()), msg)
	}
}

// Errors of the journal's operations carry the "idemretry: " prefix once,
// and still wrap their sentinels.
func TestErrorPrefixOnce(t *testing.T) {
	t.Parallel()
	j, err := filejournal.Open(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, j.Close())
	ctx := context.Background()
	r := journal.Record{ActionID: "pay:1", Key: uuid.NewString(), CreatedAt: time.Now(), State: journal.StatePending}
	_, _, rerr := j.Reserve(ctx, r, journal.ReuseAny)
	_, uerr := j.Unfinished(ctx)
	for _, err := range []error{rerr, j.Update(ctx, r), uerr, j.Forget(ctx, "pay:1"), j.Sync(ctx), j.Compact(ctx)} {
		require.Error(t, err)
		assert.ErrorIs(t, err, journal.ErrClosed)
		assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), err.Error())
	}
	assert.Equal(t, `idemretry: journal reserve "pay:1": journal closed`, rerr.Error())

	bad := r
	bad.Key = "has space"
	j, err = filejournal.Open(t.TempDir())
	require.NoError(t, err)
	defer j.Close()
	_, _, err = j.Reserve(ctx, bad, journal.ReuseAny)
	assert.ErrorIs(t, err, journal.ErrInvalidRecord)
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), err.Error())
	assert.False(t, errors.Is(err, journal.ErrClosed))
}
