package filejournal

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanTrace is what a scan did: its result, its error, and the frames it
// applied, in order.
type scanTrace struct {
	res    scanResult
	err    string
	frames []tracedFrame
}

type tracedFrame struct {
	seq     uint64
	payload string
}

func traceScan(src *source, salvage bool) scanTrace {
	var tr scanTrace
	res, err := scanSource(src, "j", salvage, func(seq uint64, p []byte) error {
		if err := decodeOps(p, func(*op, []byte) error { return nil }); err != nil {
			return err
		}
		tr.frames = append(tr.frames, tracedFrame{seq, string(p)})
		return nil
	})
	tr.res = res
	if err != nil {
		tr.err = err.Error()
	}
	return tr
}

// readerSource is a source reading data through a window of win bytes, as
// Open reads a journal file.
func readerSource(t testing.TB, data []byte, win int) *source {
	src, err := fileSource(bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err)
	src.win = win
	return src
}

// damagedJournals returns a journal of n records, one frame each, and
// copies of it damaged in the ways recovery tells apart: a torn tail, a bit
// flip (the last frame, then one followed by others), a frame missing,
// bytes that are no frame, and a copy of an earlier frame, before and after
// the frames that follow it.
func damagedJournals(t testing.TB, n int) [][]byte {
	data, _ := buildJournal(t, n)
	offs := frameOffsets(t, data)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f1 := data[offs[1]:offs[2]]
	return [][]byte{
		data,
		data[:len(data)-5],
		data[:headerSize+3],
		flipBit(data, len(data)-3, 2),
		flipBit(data, offs[1]+20, 5),
		cat(data[:offs[1]], data[offs[2]:]),
		cat(data[:offs[2]], []byte("not a frame at all"), data[offs[2]:]),
		cat(data[:offs[2]], f1, data[offs[2]:]),
		cat(data, f1),
		cat(data, data[offs[0]:offs[1]], f1[:len(f1)-1]),
	}
}

// FuzzScanSource: scanning a journal through a window of any size, as Open
// reads the file, decides exactly what scanning it whole in memory decides:
// the same frames applied, the same end, torn tail, copies, salvaged ranges
// and errors.
func FuzzScanSource(f *testing.F) {
	for i, d := range damagedJournals(f, 4) {
		f.Add(d, uint16(i*37))
	}
	f.Fuzz(func(t *testing.T, data []byte, win uint16) {
		for _, salvage := range []bool{false, true} {
			want := traceScan(memSource(data), salvage)
			got := traceScan(readerSource(t, data, int(win%600)+1), salvage)
			if want.err != got.err || !assert.ObjectsAreEqual(want, got) {
				t.Fatalf("salvage %v, window %d:\nwhole: %+v\nwindowed: %+v", salvage, int(win%600)+1, want, got)
			}
		}
	})
}

// A journal file cut short while it is scanned (by something that ignores
// the lock) is an error to report, not a torn tail to cut: the bytes the
// scan no longer finds may be acknowledged records.
func TestScanSourceFileShrinking(t *testing.T) {
	path := filepath.Join(t.TempDir(), journalName)
	require.NoError(t, os.WriteFile(path, recoveryJournal(2000), 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	src, err := openSource(f)
	require.NoError(t, err)
	src.win = 4096
	frames := 0
	res, err := scanSource(src, path, true, func(uint64, []byte) error {
		if frames++; frames == 1 {
			return os.Truncate(path, int64(src.size/2))
		}
		return nil
	})
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	var ce *CorruptionError
	assert.False(t, errors.As(err, &ce))
	assert.False(t, res.torn)
	assert.Empty(t, res.salvaged)
}

// Open reads a journal several windows long as it reads a short one: every
// record of a clean one; a torn tail cut off and copied aside whole; a
// damaged frame in the middle refused, or skipped by salvage with the
// whole file copied aside; a copy of a frame from the first window found
// in the last, and the journal rewritten without it.
func TestRecoverAcrossWindows(t *testing.T) {
	const n = 70_000 // about 5 MB: four windows
	data := recoveryJournal(n)
	require.Greater(t, len(data), 2*windowSize)
	h, err := parseHeader(data)
	require.NoError(t, err)
	offs := frameOffsets(t, data)
	mid := len(offs) / 2
	ids := []string{"order-00000000", "order-" + pad8(n/2), "order-" + pad8(n-1)}

	t.Run("clean", func(t *testing.T) {
		s, rep := mustOpen(t, writeJournal(t, data), testOpts())
		defer s.Close()
		assert.Equal(t, n, rep.Records)
		assert.False(t, rep.TornTail || rep.Compacted)
		for _, id := range ids {
			_, ok, err := s.get(id)
			require.NoError(t, err)
			assert.True(t, ok, id)
		}
	})

	t.Run("torn tail", func(t *testing.T) {
		next := appendFrame(nil, h.gen, uint64(len(offs))+1, data[offs[0]+frameHeaderSize:offs[1]])
		torn := append(append([]byte(nil), data...), next[:len(next)/2]...)
		s, rep := mustOpen(t, writeJournal(t, torn), testOpts())
		defer s.Close()
		assert.Equal(t, n, rep.Records)
		assert.True(t, rep.TornTail)
		assert.Equal(t, int64(len(data)), rep.TornOffset)
		assert.Equal(t, int64(len(next)/2), rep.TornBytes)
		aside, err := os.ReadFile(rep.TornCopy)
		require.NoError(t, err)
		assert.Equal(t, torn[len(data):], aside)
	})

	t.Run("damage", func(t *testing.T) {
		bad := flipBit(data, offs[mid]+40, 3)
		want := traceScan(memSource(bad), true)
		require.Len(t, want.res.salvaged, 1)

		dir := writeJournal(t, bad)
		wantCE := *want.res.salvaged[0]
		wantCE.Path = filepath.Join(dir, journalName)
		_, err := Open(dir)
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, wantCE, *ce)
		onDisk, err := os.ReadFile(filepath.Join(dir, journalName))
		require.NoError(t, err)
		assert.Equal(t, bad, onDisk, "nothing changed without salvage")

		o := testOpts()
		o.salvage = true
		s, rep := mustOpen(t, dir, o)
		defer s.Close()
		assert.Equal(t, n-64, rep.Records)
		require.Len(t, rep.Salvaged, 1)
		assert.Equal(t, wantCE, *rep.Salvaged[0])
		aside, err := os.ReadFile(rep.CorruptCopy)
		require.NoError(t, err)
		assert.Equal(t, bad, aside)
	})

	t.Run("copy of an early frame", func(t *testing.T) {
		dup := append(append([]byte(nil), data...), data[offs[3]:offs[4]]...)
		dup = append(dup, appendFrame(nil, h.gen, uint64(len(offs))+1, data[offs[0]+frameHeaderSize:offs[1]])...)
		want := traceScan(memSource(dup), false)
		require.Len(t, want.res.dups, 1)
		s, rep := mustOpen(t, writeJournal(t, dup), testOpts())
		defer s.Close()
		assert.Equal(t, n, rep.Records)
		assert.Equal(t, 1, rep.Duplicates)
		assert.True(t, rep.Compacted)
	})
}
