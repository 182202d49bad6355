package filejournal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// insertCopy returns data with a copy of frame k inserted after frame at.
func insertCopy(data []byte, offs []int, k, at int) []byte {
	end := func(i int) int {
		if i+1 < len(offs) {
			return offs[i+1]
		}
		return len(data)
	}
	out := append([]byte(nil), data[:end(at)]...)
	out = append(out, data[offs[k]:end(k)]...)
	return append(out, data[end(at):]...)
}

// A duplicated frame (the same valid frame twice) is recognised as a copy of
// an applied one and skipped: no acknowledged frame after it is lost, and
// nothing is reported torn or corrupt while new frames follow it.
func TestDuplicatedFrame(t *testing.T) {
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data) // frame 0: the empty snapshot; frame i: es[i-1]
	last := len(offs) - 1
	cases := []struct {
		name  string
		k, at int
		torn  bool
	}{
		{"first frame twice", 0, 0, false},
		{"middle frame twice", 2, 2, false},
		{"just before the last frame", last - 1, last - 1, false},
		{"last frame twice", last, last, true}, // a copy at the tail: cut, nothing lost
		{"older frame in the middle", 1, 3, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeJournal(t, insertCopy(data, offs, c.k, c.at))
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, c.torn, rep.TornTail, "torn tail")
			assert.Equal(t, len(es), rep.Records)
			for _, e := range es {
				got, ok, _ := s.get(e.ActionID)
				require.True(t, ok, "%s lost", e.ActionID)
				assert.Equal(t, e.Key, got.Key)
			}
			if !c.torn {
				assert.Equal(t, 1, rep.Duplicates)
			}
			reserve(t, s, entry("after"))
			require.NoError(t, s.Close())
			s, _, err = openWith(dir, testOpts())
			require.NoError(t, err, "reopen after an append")
			_, ok, _ := s.get("after")
			assert.True(t, ok)
		})
	}
}

// The case seen in the field: the frame before a Forget duplicated; the
// Forget, the last frame, must not be cut as a torn tail.
func TestDuplicateBeforeForget(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	a := reserve(t, s, entry("a"))
	reserve(t, s, entry("b"))
	require.NoError(t, s.Forget(context.Background(), "a"))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	offs := frameOffsets(t, data)
	last := len(offs) - 1
	dir = writeJournal(t, insertCopy(data, offs, last-1, last-1))
	s, rep, err := openWith(dir, testOpts())
	require.NoError(t, err)
	defer s.Close()
	assert.False(t, rep.TornTail, "the Forget was reported torn")
	_, ok, _ := s.get("a")
	assert.False(t, ok, "forgotten action %s came back", a.Key)
}

// With salvage, a duplicate followed later by real damage loses the damaged
// frame only, never the frame after the duplicate.
func TestDuplicateThenDamageSalvage(t *testing.T) {
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	d := insertCopy(data, offs, 2, 2) // frame 2 twice
	doffs := append(append([]int(nil), offs[:3]...), offs[3]-offs[2]+offs[3])
	for _, o := range offs[3:] {
		doffs = append(doffs, o+offs[3]-offs[2])
	}
	doffs = append(doffs[:3], doffs[4:]...) // frame starts after the copy
	d = flipBit(d, doffs[4]+20, 1)          // damage frame 4 (es[3])
	dir := writeJournal(t, d)
	_, _, err := openWith(dir, testOpts())
	var ce *CorruptionError
	require.True(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, int64(doffs[4]), ce.Offset)
	o := testOpts()
	o.salvage = true
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	defer s.Close()
	require.Len(t, rep.Salvaged, 1)
	for i, e := range es {
		_, ok, _ := s.get(e.ActionID)
		assert.Equal(t, i != 3, ok, "record %d (frame %d)", i, i+1)
	}
}

// Damage inserted before an intact frame loses nothing: it is reported as
// corruption (not cut with the frame after it), and salvage keeps the frame.
func TestGarbageBeforeIntactFrame(t *testing.T) {
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	last := len(offs) - 1
	for _, at := range []int{2, last - 1} {
		d := append([]byte(nil), data[:offs[at+1]]...)
		d = append(d, "some garbage!"...)
		d = append(d, data[offs[at+1]:]...)
		dir := writeJournal(t, d)
		_, _, err := openWith(dir, testOpts())
		var ce *CorruptionError
		require.True(t, errors.As(err, &ce), "garbage after frame %d: %v", at, err)
		assert.Equal(t, int64(offs[at+1]), ce.Offset)
		o := testOpts()
		o.salvage = true
		s, _, err := openWith(dir, o)
		require.NoError(t, err)
		for _, e := range es {
			_, ok, _ := s.get(e.ActionID)
			assert.True(t, ok, "garbage after frame %d: %s lost", at, e.ActionID)
		}
		require.NoError(t, s.Close())
	}
}
