package journal

import (
	"context"
	"crypto/rand"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	errTestClosed   = fmt.Errorf("test: closed")
	errTestNotFound = fmt.Errorf("test: not found")
)

func testOpts() Options {
	return Options{Retention: 48 * time.Hour, ErrClosed: errTestClosed, ErrNotFound: errTestNotFound}
}

func mustOpen(t testing.TB, dir string, o Options) (*Store, Report) {
	t.Helper()
	s, rep, err := Open(dir, o)
	require.NoError(t, err)
	return s, rep
}

func newKey() string {
	var k [16]byte
	_, _ = rand.Read(k[:])
	return formatUUID(&k)
}

func entry(id string) Entry {
	e := Entry{ID: id, Key: newKey(), CreatedMs: time.Now().UnixMilli(), State: StatePending}
	copy(e.Fingerprint[:], id)
	return e
}

func reserve(t testing.TB, s *Store, e Entry) Entry {
	t.Helper()
	got, created, err := s.Reserve(context.Background(), e, false)
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
	for off := HeaderSize; off < len(data); {
		_, _, next, ok := frameAt(data, off, h.gen)
		require.True(t, ok, "frame at %d", off)
		offs = append(offs, off)
		off = next
	}
	return offs
}

// buildJournal writes n records, one frame each, and returns the file's
// bytes and the entries.
func buildJournal(t testing.TB, n int) ([]byte, []Entry) {
	t.Helper()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	var es []Entry
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
// most n: a Store must leave no goroutine behind after Close.
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
func keyOf(t testing.TB, s *Store, id string) string {
	t.Helper()
	e, _, err := s.Get(id)
	if err != nil {
		return ""
	}
	return e.Key
}
