package filejournal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkPrefix asserts that s holds exactly the first n entries of es.
func checkPrefix(t *testing.T, s *Journal, es []journal.Record, n int, msg string) {
	t.Helper()
	for i, e := range es {
		got, ok, err := s.get(e.ActionID)
		require.NoError(t, err)
		if i < n {
			if assert.True(t, ok, "%s: entry %d missing", msg, i) {
				assert.Equal(t, e.Key, got.Key, msg)
			}
		} else {
			assert.False(t, ok, "%s: entry %d should not exist", msg, i)
		}
	}
}

// T3: a crash can cut the file anywhere in the frames being written. Every
// prefix comes back with the records of its whole frames, no error, and the
// journal accepts appends afterwards.
func TestTruncateEveryOffset(t *testing.T) {
	data, es := buildJournal(t, 6)
	offs := frameOffsets(t, data)
	require.Len(t, offs, 7) // the empty snapshot's end frame, then 6 records
	for cut := offs[4]; cut < len(data); cut++ {
		whole := 0 // records in frames entirely before cut
		for i := 1; i < len(offs); i++ {
			end := len(data)
			if i+1 < len(offs) {
				end = offs[i+1]
			}
			if end <= cut {
				whole = i
			}
		}
		dir := writeJournal(t, data[:cut])
		s, rep, err := openWith(dir, testOpts())
		require.NoError(t, err, "cut %d", cut)
		assert.Equal(t, cut != offs[whole+1], rep.TornTail, "cut %d", cut)
		checkPrefix(t, s, es, whole, "cut")
		if cut%5 == 0 {
			reserve(t, s, entry("after"))
			require.NoError(t, s.Close())
			s, _ = mustOpen(t, dir, testOpts())
			_, ok, _ := s.get("after")
			assert.True(t, ok, "append after recovery from cut %d", cut)
		}
		require.NoError(t, s.Close())
	}
}

// T4: what a crash can leave after the last whole frame is torn, never
// corruption, and is copied aside.
func TestTailModels(t *testing.T) {
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	last := offs[len(offs)-1]
	garbage := make([]byte, 200)
	for i := range garbage {
		garbage[i] = byte(i*7 + 3)
	}
	halfZeroed := append([]byte(nil), data...)
	for i := last + (len(data)-last)/2; i < len(data); i++ {
		halfZeroed[i] = 0
	}
	models := map[string]struct {
		file  []byte
		whole int
	}{
		"zeros":              {append(append([]byte(nil), data...), make([]byte, 4096)...), 5},
		"garbage":            {append(append([]byte(nil), data...), garbage...), 5},
		"stale frame":        {append(append([]byte(nil), data...), data[offs[2]:offs[3]]...), 5},
		"last frame zeroed":  {halfZeroed, 4},
		"last header zeroed": {append(append([]byte(nil), data[:last]...), make([]byte, len(data)-last)...), 4},
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			dir := writeJournal(t, m.file)
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.True(t, rep.TornTail)
			checkPrefix(t, s, es, m.whole, name)
			aside, err := os.ReadFile(rep.TornCopy)
			require.NoError(t, err)
			assert.Equal(t, m.file[rep.TornOffset:], aside)
		})
	}
}

// T5: a flipped bit in a frame that later frames follow is damage to
// acknowledged data: refused, naming the frame's offset.
func TestBitFlipInNonFinalFrame(t *testing.T) {
	data, _ := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	start, end := offs[2], offs[3]
	for i := start; i < end; i++ {
		d := flipBit(data, i, uint(i%8))
		dir := writeJournal(t, d)
		_, _, err := openWith(dir, testOpts())
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce, "flip at %d", i)
		assert.ErrorIs(t, err, ErrCorrupt)
		assert.Equal(t, int64(start), ce.Offset, "flip at %d", i)
		assert.Equal(t, filepath.Join(dir, journalName), ce.Path)
		// Refusing changes nothing on disk.
		after, _ := os.ReadFile(filepath.Join(dir, journalName))
		assert.True(t, bytes.Equal(d, after))
	}
}

func TestHeaderFlips(t *testing.T) {
	data, _ := buildJournal(t, 2)
	for i := range headerSize {
		dir := writeJournal(t, flipBit(data, i, uint(i%8)))
		_, _, err := openWith(dir, testOpts())
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce, "flip at %d", i)
		assert.Equal(t, int64(0), ce.Offset)
	}
	// A valid header of an unknown major version is refused as such.
	d := append([]byte(nil), data...)
	d[8] = 2
	binary.LittleEndian.PutUint32(d[28:], crcOf(d[:28]))
	_, _, err := openWith(writeJournal(t, d), testOpts())
	assert.ErrorIs(t, err, journal.ErrIncompatible)
	assert.NotErrorIs(t, err, ErrCorrupt)
}

// Length flips are bounded: no allocation follows a huge length.
func TestLengthFlipsBounded(t *testing.T) {
	data, _ := buildJournal(t, 4)
	offs := frameOffsets(t, data)
	for _, n := range []uint32{0xffffffff, 0x7fffffff, maxPayload + 1, 1 << 30} {
		d := append([]byte(nil), data...)
		binary.LittleEndian.PutUint32(d[offs[2]+4:], n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := openWith(writeJournal(t, d), testOpts())
		runtime.ReadMemStats(&after)
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, int64(offs[2]), ce.Offset)
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "length %#x", n)
	}
}

func TestSalvage(t *testing.T) {
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	d := flipBit(data, offs[3]+20, 3) // frame 3 holds es[2]
	dir := writeJournal(t, d)
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, ErrCorrupt)

	o := testOpts()
	o.salvage = true
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	require.Len(t, rep.Salvaged, 1)
	assert.Equal(t, int64(offs[3]), rep.Salvaged[0].Offset)
	assert.Equal(t, int64(offs[4]-offs[3]), rep.Salvaged[0].Length)
	assert.True(t, rep.Compacted)
	aside, err := os.ReadFile(rep.CorruptCopy)
	require.NoError(t, err)
	assert.Equal(t, d, aside)
	for i, e := range es {
		got, ok, _ := s.get(e.ActionID)
		if i == 2 {
			assert.False(t, ok)
			continue
		}
		require.True(t, ok)
		assert.Equal(t, e.Key, got.Key)
	}
	require.NoError(t, s.Close())
	// The rewrite removed the damage: a plain open works.
	s, _ = mustOpen(t, dir, testOpts())
	require.NoError(t, s.Close())
}

func TestHashedFlagMismatch(t *testing.T) {
	dir := t.TempDir()
	o := testOpts()
	o.hashed = true
	s, _ := mustOpen(t, dir, o)
	require.NoError(t, s.Close())
	_, _, err := openWith(dir, testOpts())
	assert.ErrorIs(t, err, journal.ErrIncompatible)
	s, _ = mustOpen(t, dir, o)
	require.NoError(t, s.Close())
}

// T8 (in process): the states a compaction crash can leave. A complete
// journal.tmp is adopted when journal is missing or journal.tmp starts past
// journal's last frame (its rename was lost, and later appends may be in
// it); it is removed when journal went on past its base (a stale leftover)
// or when it is incomplete.
func TestCompactionLeftovers(t *testing.T) {
	data, es := buildJournal(t, 3)
	// A complete snapshot, as a compaction writes it.
	snapDir := t.TempDir()
	s, _ := mustOpen(t, snapDir, testOpts())
	for _, e := range es {
		reserve(t, s, e)
	}
	require.NoError(t, s.Compact(context.Background()))
	snap, err := os.ReadFile(filepath.Join(snapDir, journalName))
	require.NoError(t, err)
	// The same file after an acknowledged append: a snapshot followed by
	// a batch frame.
	reserve(t, s, entry("after-compaction"))
	require.NoError(t, s.Close())
	later, err := os.ReadFile(filepath.Join(snapDir, journalName))
	require.NoError(t, err)
	require.True(t, snapshotComplete(snap, "snap"))
	require.False(t, snapshotComplete(snap[:len(snap)-1], "snap"))
	require.True(t, snapshotComplete(later, "later"))
	require.True(t, snapshotComplete(later[:len(later)-1], "later"), "a torn append after the end record")

	cases := []struct {
		name            string
		journal, tmp    []byte
		adopted, remove bool
		records         int
	}{
		{"renamed not yet", nil, snap, true, false, 3},
		{"rename lost, appends under tmp", nil, later, true, false, 4},
		{"rename lost, old journal kept", data, later, true, false, 4},
		{"tmp starts past journal", data, snap, true, false, 3},
		{"rename done, tmp stale", later, snap, false, true, 4},
		{"tmp incomplete, journal missing", nil, snap[:len(snap)-3], false, true, 0},
		{"tmp incomplete, journal present", data, snap[:40], false, true, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.journal != nil {
				require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), c.journal, 0o600))
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, tmpName), c.tmp, 0o600))
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, c.adopted, rep.AdoptedTemp)
			assert.Equal(t, c.remove, rep.RemovedTemp)
			assert.Equal(t, c.records, rep.Records)
			_, err = os.Stat(filepath.Join(dir, tmpName))
			assert.True(t, errors.Is(err, os.ErrNotExist))
		})
	}
}
