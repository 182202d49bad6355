package filejournal

import (
	"context"
	"crypto/rand"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// testOpts returns the default config, checked: a retention of 48 h and a
// clock lead of 24 h.
func testOpts() config {
	c := defaultConfig()
	if err := c.check(); err != nil {
		panic(err)
	}
	return c
}

// openWith opens a journal in dir with o, a config that tests may have
// changed after testOpts, and returns its Recovery too.
func openWith(dir string, o config) (*Journal, Recovery, error) {
	j, err := open(dir, o)
	if err != nil {
		return nil, Recovery{}, err
	}
	return j, j.Recovery(), nil
}

// update is Journal.Update of the state, attempts and status of the
// record of id with key.
func update(s *Journal, id, key string, state journal.State, attempts uint32, status uint16) error {
	return s.Update(context.Background(), journal.Record{ActionID: id, Key: key, State: state, Attempts: int(attempts), Status: int(status)})
}

func mustOpen(t testing.TB, dir string, o config) (*Journal, Recovery) {
	t.Helper()
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	return s, rep
}

// openFlushing opens a journal in a new directory whose flush timer writes
// the lazy updates every flush, and returns it with the directory.
func openFlushing(t testing.TB, flush time.Duration) (*Journal, string) {
	t.Helper()
	o := testOpts()
	o.flushEvery = flush
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	return s, dir
}

// inBackground calls f over and over on a goroutine of its own until the
// returned stop is called; stop returns once f has.
func inBackground(f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
				f()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

func newKey() string {
	var k [16]byte
	_, _ = rand.Read(k[:])
	return formatUUID(&k)
}

func entry(id string) journal.Record {
	e := journal.Record{ActionID: id, Key: newKey(), CreatedAt: time.UnixMilli(time.Now().UnixMilli()), State: journal.StatePending}
	copy(e.Fingerprint[:], id)
	return e
}

func reserve(t testing.TB, s *Journal, e journal.Record) journal.Record {
	t.Helper()
	got, created, err := s.Reserve(context.Background(), e, journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	return got
}

// frameOffsets returns the start offset of every valid frame of a journal
// file, and the file's end.
func frameOffsets(t testing.TB, data []byte) []int {
	t.Helper()
	h, err := parseHeader(data)
	require.NoError(t, err)
	var offs []int
	for off := headerSize; off < len(data); {
		_, _, next, ok := frameAt(data, off, h.gen)
		require.True(t, ok, "frame at %d", off)
		offs = append(offs, off)
		off = next
	}
	return offs
}

// buildJournal writes n records, one frame each, and returns the file's
// bytes and the entries.
func buildJournal(t testing.TB, n int) ([]byte, []journal.Record) {
	t.Helper()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	var es []journal.Record
	for i := range n {
		es = append(es, reserve(t, s, entry(fmt.Sprintf("action-%03d", i))))
	}
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	return data, es
}

func writeJournal(t testing.TB, data []byte) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), data, 0o600))
	return dir
}

func flipBit(data []byte, off int, bit uint) []byte {
	d := append([]byte(nil), data...)
	d[off] ^= 1 << bit
	return d
}

// waitGoroutines fails if the goroutine count does not come back to at
// most n: a Journal must leave no goroutine behind after Close.
func waitGoroutines(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d > %d\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// keyOf returns the key of id's record, or "" if there is none.
func keyOf(t testing.TB, s *Journal, id string) string {
	t.Helper()
	e, _, err := s.get(id)
	if err != nil {
		return ""
	}
	return e.Key
}

// fakeClock is a wall clock the test sets.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// hourClock returns test options on a fake clock set to t0 (2026-03-01
// 12:00 UTC), with a retention of one hour.
func hourClock() (o config, clk *fakeClock, t0 time.Time) {
	t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk = &fakeClock{t: t0}
	o = testOpts()
	o.now, o.retention = clk.Now, time.Hour
	return o, clk, t0
}

// faultyHourClock is hourClock whose files fail as fail says (see
// faultyFile).
func faultyHourClock() (o config, clk *fakeClock, t0 time.Time, fail *sync.Map) {
	o, clk, t0 = hourClock()
	fail = new(sync.Map)
	o.hooks = faultyHooks(fail)
	return o, clk, t0, fail
}

// openHolding opens a journal in dir with o and reserves recs in it.
func openHolding(t testing.TB, dir string, o config, recs ...journal.Record) *Journal {
	t.Helper()
	s, _ := mustOpen(t, dir, o)
	for _, r := range recs {
		reserve(t, s, r)
	}
	return s
}

// doneAt is entry(id), done, created at (to the millisecond).
func doneAt(id string, at time.Time) journal.Record {
	d := entry(id)
	d.CreatedAt, d.State = time.UnixMilli(at.UnixMilli()), journal.StateDone
	return d
}

// faultyHooks wraps every file the journal opens in a faultyFile driven by
// fail.
func faultyHooks(fail *sync.Map) *hooks {
	return &hooks{wrapFile: func(name string, f file) file { return &faultyFile{file: f, fail: fail, name: name} }}
}

// failCompaction makes one compaction of s fail writing journal.tmp, before
// its rename.
func failCompaction(t testing.TB, s *Journal, fail *sync.Map) {
	t.Helper()
	fail.Store("short:"+tmpName, true)
	require.ErrorIs(t, s.Compact(context.Background()), errNoSpace)
	fail.Delete("short:" + tmpName)
}

// requireLocked requires an Open of dir to be refused with ErrLocked at
// once, and again after waiting wait for the lock.
func requireLocked(t testing.TB, dir string, wait time.Duration) {
	t.Helper()
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, ErrLocked)
	o := testOpts()
	o.lockWait = wait
	start := time.Now()
	_, _, err = openWith(dir, o)
	require.ErrorIs(t, err, ErrLocked)
	require.GreaterOrEqual(t, time.Since(start), wait)
}

// openFaulty opens a journal in dir whose files fail as fail says (see
// faultyFile).
func openFaulty(t testing.TB, dir string) (*Journal, *sync.Map) {
	t.Helper()
	fail := new(sync.Map)
	o := testOpts()
	o.hooks = faultyHooks(fail)
	s, _ := mustOpen(t, dir, o)
	return s, fail
}

// smallFS mounts a 64 KiB tmpfs, so that a test can fill it: see
// smallFSOf.
func smallFS(t *testing.T) string { t.Helper(); return smallFSOf(t, "64k") }

// smallFSOf mounts a tmpfs of the given size (mount's size=, "1m" say) on a
// new directory, unmounted when the test ends, so that a test can fill a
// real file system. It needs root: without, the test is skipped, except
// with CI=true, where it fails (CI runs as root and must run these tests).
func smallFSOf(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mounting a small tmpfs needs root, and CI=true: CI must run the full-disk tests")
		}
		t.Skip("mounting a small tmpfs needs root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount tmpfs, and CI=true: %v: %s", err, out)
		}
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// fill writes the file "filler" in dir until the file system is full.
func fill(t testing.TB, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "filler"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	for len(buf) > 1 { // and the last few bytes
		buf = buf[:len(buf)/2]
		_, _ = f.Write(buf)
	}
}

// unfill removes what fill wrote in dir: the file system has room again.
func unfill(t testing.TB, dir string) {
	t.Helper()
	require.NoError(t, os.Remove(filepath.Join(dir, "filler")))
}

// onlyOn skips t unless it runs on one of the systems goos: for a test of
// what only they do (a SIGKILL read back from a child's exit status, say).
func onlyOn(t testing.TB, goos ...string) {
	t.Helper()
	if !slices.Contains(goos, runtime.GOOS) {
		t.Skipf("only on %v", goos)
	}
}

// onlyOnUnix skips t on systems without Unix permissions and symlinks.
func onlyOnUnix(t testing.TB) {
	t.Helper()
	switch runtime.GOOS {
	case "windows", "plan9", "js", "wasip1":
		t.Skipf("not on %s", runtime.GOOS)
	}
}
