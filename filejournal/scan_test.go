package filejournal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/race"
)

// Tests of the scan of a journal file (scan.go, crcprefix.go): the read
// window, crafted bytes, the search for a later frame and salvage, bounded
// in work and memory.

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
	t.Parallel()
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
	t.Parallel()
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

// The crafted-input part of hW2's review of the file journal: recovery's
// search for a later frame after damage (findLater) must do work in
// proportion to the file, whatever its bytes.

// craftedCandidates returns a journal file of about n bytes: a valid header of
// generation gen, then, every 16 bytes, a frame header that passes
// findLater's cheap filters (a plausible sequence; length, at most
// maxPayload, for its payload's) and fails its CRC.
func craftedCandidates(n int, gen, length uint32) []byte {
	b := header{minor: versionMinor, flags: formatFlags, gen: gen, baseSeq: 1}.append(nil)
	for len(b) < n {
		var h [16]byte
		binary.LittleEndian.PutUint32(h[0:4], 0xdeadbeef)
		binary.LittleEndian.PutUint32(h[4:8], length)
		binary.LittleEndian.PutUint64(h[8:16], 2)
		b = append(b, h[:]...)
	}
	return b
}

// TestScanSearchWorkBoundedOnCraftedBytes: 2 MiB whose every 16 bytes look
// like the header of a 1 MiB frame made findLater run a CRC over 1 MiB for
// each, some 65,000 of them (3.7 s for 2 MiB here, and linear in the file
// from there, about 3 minutes for 100 MiB, where a real journal of that
// size opens in a fraction of a second). The scan's verdict is unchanged (a
// torn tail: nothing valid follows) and its CRC work stays within a small
// multiple of the file.
func TestScanSearchWorkBoundedOnCraftedBytes(t *testing.T) {
	t.Parallel()
	data := craftedCandidates(2<<20, 7, maxPayload)
	for _, src := range []*source{memSource(data), readerSource(t, data, windowSize)} {
		res, err := scanSource(src, "j", false, func(uint64, []byte) error { return nil })
		require.NoError(t, err)
		require.True(t, res.torn)
		require.Equal(t, headerSize, res.end)
		require.LessOrEqual(t, src.crcBytes, 40*len(data), "bytes run through a CRC by the search, for a file of %d", len(data))
	}
}

// TestScanPrefixCRCMatchesFrameCRC: the CRC a crcPrefix derives for a
// stretch of a source is the one frameCRC computes over its bytes, at any
// offset and length (up to maxPayload), rising offsets, through memory and
// through a file's reads.
func TestScanPrefixCRCMatchesFrameCRC(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(12, 2))
	data := make([]byte, 3*maxPayload)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, src := range []*source{memSource(data), readerSource(t, data, windowSize)} {
		start := rng.IntN(1000)
		pre := newCRCPrefix(src, start)
		checked := 0
		for p := start; p+frameHeaderSize < len(data); p += 1 + rng.IntN(20000) {
			n := rng.IntN(min(maxPayload, len(data)-p-frameHeaderSize) + 1)
			if rng.IntN(8) == 0 {
				n = min(maxPayload, len(data)-p-frameHeaderSize)
			}
			gen := rng.Uint32()
			got, err := pre.frameCRCAt(p, n, gen)
			require.NoError(t, err)
			want := frameCRC(gen, data[p+4:p+frameHeaderSize], data[p+frameHeaderSize:p+frameHeaderSize+n])
			require.Equal(t, want, got, "offset %d, payload %d", p, n)
			checked++
		}
		require.Greater(t, checked, 100)
	}
	// The shift is the CRC of zero bytes.
	for _, n := range []int{0, 1, 7, 8, 1000, maxPayload} {
		r := rng.Uint32()
		want := ^crc32.Update(^r, castagnoli, make([]byte, n))
		require.Equal(t, want, shiftBytes(r, n), "%d zero bytes", n)
	}
}

// TestScanLongFrameAfterCraftedBytesFound: a valid frame with a long payload
// after the crafted candidates is found as before: the next frame after
// them is "bytes that are no frame" (FirstLostSeq 0, nothing lost), a later
// one is acknowledged data lost; with salvage, the frame is applied.
func TestScanLongFrameAfterCraftedBytesFound(t *testing.T) {
	t.Parallel()
	const gen = 99
	junk := craftedCandidates(300<<10, gen, 64<<10) // each a candidate of 64 KiB
	// A payload of many delete records: a frame of about 200 KiB.
	var ops []op
	for i := 0; len(ops) < 9000; i++ {
		ops = append(ops, op{kind: opDelete, r: rec{id: fmt.Sprintf("action-%06d-with-a-long-id", i)}})
	}
	payload := appendPayload(nil, ops)
	require.Greater(t, len(payload), crcDirectMax)
	for _, seq := range []uint64{1, 3} {
		data := appendFrame(append([]byte(nil), junk...), gen, seq, payload)
		for _, win := range []int{windowSize, 64 << 10} {
			src := readerSource(t, data, win)
			if win == windowSize {
				src = memSource(data)
			}
			_, err := scanSource(src, "j", false, func(uint64, []byte) error { return nil })
			var ce *CorruptionError
			require.ErrorAs(t, err, &ce, "seq %d", seq)
			require.Equal(t, int64(headerSize), ce.Offset)
			require.Equal(t, int64(len(junk)-headerSize), ce.Length)
			if seq == 1 {
				require.Zero(t, ce.FirstLostSeq)
			} else {
				require.Equal(t, uint64(1), ce.FirstLostSeq)
				require.Equal(t, uint64(2), ce.LastLostSeq)
			}
			applied := 0
			src = memSource(data)
			res, err := scanSource(src, "j", true, func(s uint64, p []byte) error {
				require.Equal(t, seq, s)
				require.Equal(t, payload, p)
				applied++
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, 1, applied)
			require.Equal(t, len(data), res.end)
			require.LessOrEqual(t, src.crcBytes, 40*len(data))
		}
	}
}

// hW4's review of hW2's constant-time CRC check in findLater: its verdicts,
// end to end, must be those of the direct CRC it replaced, on files of many
// valid frames of random lengths (short, just over crcDirectMax, long,
// exactly maxPayload), frames nested in other frames' payloads (candidates
// that overlap earlier ones), frames of another generation, copies, and
// damage injected at random.

// directFindLater is findLater as it was before crcprefix.go: every
// candidate through the plain frame check.
func directFindLater(s *source, from int, gen uint32, minSeq uint64) (int, uint64, error) {
	for p := from; p+frameHeaderSize <= s.size; p++ {
		h, err := s.bytes(p, frameHeaderSize)
		if err != nil {
			return -1, 0, err
		}
		seq := binary.LittleEndian.Uint64(h[8:16])
		if seq < minSeq || seq-minSeq > uint64(s.size-from)/frameHeaderSize {
			continue
		}
		if got, _, _, ok, err := s.frame(p, gen); err != nil {
			return -1, 0, err
		} else if ok && got == seq {
			return p, seq, nil
		}
	}
	return -1, 0, nil
}

// findLaterFile returns a journal file of generation gen and its frames' offsets.
func findLaterFile(rng *rand.Rand, gen uint32, base uint64, frames int, big bool) ([]byte, []int) {
	data := header{minor: versionMinor, flags: formatFlags, gen: gen, baseSeq: base}.append(nil)
	var offs []int
	seq := base
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for i := 0; i < frames; i++ {
		var n int
		switch r := rng.IntN(20); {
		case r < 6:
			n = rng.IntN(crcDirectMax + 1)
		case r < 9:
			n = crcDirectMax + rng.IntN(3) - 1 // 511, 512, 513
		case r < 16:
			n = crcDirectMax + 1 + rng.IntN(20000)
		case r < 18:
			n = rng.IntN(100000)
		default:
			if big {
				n = maxPayload - rng.IntN(2)
			} else {
				n = rng.IntN(5000)
			}
		}
		payload := randBytes(n)
		// Some payloads hold a whole valid frame of a plausible later
		// sequence, long or short: a candidate inside another.
		if n > 2000 && rng.IntN(3) == 0 {
			inner := randBytes(crcDirectMax - 20 + rng.IntN(n-frameHeaderSize-crcDirectMax+20))
			fr := appendFrame(nil, gen, seq+1+uint64(rng.IntN(3)), inner)
			at := rng.IntN(n - len(fr) + 1)
			copy(payload[at:], fr)
		}
		switch rng.IntN(30) {
		case 0: // a frame of another generation (a file before a compaction)
			offs = append(offs, len(data))
			data = appendFrame(data, gen+1, seq, payload)
			continue
		case 1: // a copy of an earlier frame
			if len(offs) > 0 {
				k := offs[rng.IntN(len(offs))]
				ln := frameHeaderSize + int(binary.LittleEndian.Uint32(data[k+4:]))
				data = append(data, data[k:k+ln]...)
			}
		}
		offs = append(offs, len(data))
		data = appendFrame(data, gen, seq, payload)
		seq++
	}
	return data, offs
}

// findLaterDamage damages data at random: bit flips, overwritten stretches,
// bytes cut out, junk put in (some of it a frame header with a plausible
// sequence and a long length).
func findLaterDamage(rng *rand.Rand, data []byte, gen uint32, base uint64, times int) []byte {
	for range times {
		at := headerSize + rng.IntN(len(data)-headerSize)
		switch rng.IntN(5) {
		case 0:
			data[at] ^= 1 << rng.IntN(8)
		case 1:
			for i := at; i < min(len(data), at+rng.IntN(3000)); i++ {
				data[i] = byte(rng.Uint32())
			}
		case 2:
			end := min(len(data), at+rng.IntN(5000))
			data = append(data[:at:at], data[end:]...)
		case 3:
			junk := make([]byte, rng.IntN(200))
			for i := range junk {
				junk[i] = byte(rng.Uint32())
			}
			data = append(data[:at:at], append(junk, data[at:]...)...)
		default:
			var h [16]byte
			binary.LittleEndian.PutUint32(h[0:4], rng.Uint32())
			binary.LittleEndian.PutUint32(h[4:8], uint32(rng.IntN(maxPayload+1)))
			binary.LittleEndian.PutUint64(h[8:16], base+uint64(rng.IntN(50)))
			data = append(data[:at:at], append(h[:], data[at:]...)...)
		}
	}
	return data
}

func TestScanFindLaterMatchesDirectCRC(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(4, 4))
	rounds := 4
	if testing.Short() || race.Enabled {
		rounds = 2
	}
	found, long := 0, 0
	for round := range rounds {
		gen := rng.Uint32()
		if round == 0 {
			gen = 0
		}
		base := 1 + uint64(rng.IntN(1000))
		data, offs := findLaterFile(rng, gen, base, 30+rng.IntN(30), round%3 == 0 && !race.Enabled)
		if round%2 == 1 {
			data = findLaterDamage(rng, data, gen, base, 1+rng.IntN(8))
		}
		// Where to search from: every frame's offset and a byte after it,
		// and random offsets.
		var froms []int
		for range 8 {
			if o := offs[rng.IntN(len(offs))]; o < len(data) {
				froms = append(froms, o, o+1)
			}
		}
		for range 8 {
			froms = append(froms, headerSize+rng.IntN(len(data)-headerSize))
		}
		// In order, as a scan calls, through memory and a file read in
		// small windows; in any order (the prefix restarted) through a
		// file read in whole-frame windows.
		sorted := slices.Sorted(slices.Values(froms))
		for i, src := range []*source{memSource(data), readerSource(t, data, 4096), readerSource(t, data, windowSize)} {
			ref := memSource(data)
			order := sorted
			if i == 2 {
				order = froms
			}
			for _, from := range order {
				minSeq := base + uint64(rng.IntN(120))
				if rng.IntN(4) == 0 {
					minSeq = base
				}
				wp, wseq, err := directFindLater(ref, from, gen, minSeq)
				require.NoError(t, err)
				gp, gseq, err := src.findLater(from, gen, minSeq)
				require.NoError(t, err)
				require.Equal(t, [2]any{wp, wseq}, [2]any{gp, gseq},
					"round %d: from %d, gen %d, minSeq %d, file of %d bytes", round, from, gen, minSeq, len(data))
				if wp >= 0 {
					found++
					if binary.LittleEndian.Uint32(data[wp+4:]) > crcDirectMax {
						long++
					}
				}
			}
		}
	}
	// The comparison saw long frames found, not only misses.
	require.Greater(t, long, 10, "found %d", found)
}

// hW4's review of hW2's constant-time CRC check in findLater, across
// calls: a salvage (WithSalvage) calls findLater once per damaged stretch,
// and each call made its own crcPrefix, a ring of 4.4 MB, and ran it over
// the candidate's whole length. The work of a salvage must stay within a
// small multiple of the file however many damaged stretches it has.

// salvageScan scans data with salvage, through memory and a file, and
// returns the last scan's result and, for the scans, the bytes allocated
// and the bytes the search ran its direct CRC over, at most.
func salvageScan(t *testing.T, data []byte) (res scanResult, alloc uint64, crc int) {
	t.Helper()
	for _, src := range []*source{memSource(data), readerSource(t, data, windowSize)} {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		var err error
		res, err = scanSource(src, "j", true, func(uint64, []byte) error { return nil })
		runtime.ReadMemStats(&m1)
		require.NoError(t, err)
		alloc = max(alloc, m1.TotalAlloc-m0.TotalAlloc)
		crc = max(crc, src.crcBytes)
	}
	return res, alloc, crc
}

// TestScanSalvageOfManyDamagedFramesBounded: a journal of frames of 600 to
// 1600 bytes (batches of a few records) with a bit flipped in every tenth
// frame: each damaged frame is salvaged, and the salvage allocates a small
// multiple of the file, not a ring per damaged frame.
func TestScanSalvageOfManyDamagedFramesBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 9))
	const gen = 7
	data := header{minor: versionMinor, flags: formatFlags, gen: gen, baseSeq: 1}.append(nil)
	var offs []int
	for i := range 8000 {
		p := make([]byte, 600+rng.IntN(1000))
		for k := range p {
			p[k] = byte(rng.Uint32())
		}
		offs = append(offs, len(data))
		data = appendFrame(data, gen, uint64(i+1), p)
	}
	damaged := 0
	for k := 3; k < len(offs)-1; k += 10 {
		data[offs[k]+frameHeaderSize+5] ^= 0x10
		damaged++
	}
	res, alloc, crc := salvageScan(t, data)
	require.Len(t, res.salvaged, damaged)
	require.Equal(t, uint64(len(offs)), res.lastSeq)
	limit := uint64(3*len(data) + 16<<20)
	require.LessOrEqual(t, alloc, limit, "bytes allocated by a salvage of %d damaged frames in a file of %d", damaged, len(data))
	require.LessOrEqual(t, crc, 3*len(data))
}

// TestScanSalvageOfCraftedStretchesBounded: valid short frames, each
// followed by 16 bytes that look like the header of a long frame (a
// plausible sequence and length, a wrong CRC): every one is a damaged
// stretch, a findLater call whose first candidate is long. The salvage's
// work and allocation stay within a small multiple of the file.
func TestScanSalvageOfCraftedStretchesBounded(t *testing.T) {
	const gen = 5
	data := header{minor: versionMinor, flags: formatFlags, gen: gen, baseSeq: 1}.append(nil)
	var seq uint64 = 1
	for len(data) < 256<<10 {
		data = appendFrame(data, gen, seq, []byte("a short frame"))
		seq++
		var h [16]byte
		binary.LittleEndian.PutUint32(h[0:4], 0xdeadbeef)
		binary.LittleEndian.PutUint32(h[4:8], 200<<10)
		binary.LittleEndian.PutUint64(h[8:16], seq)
		data = append(data, h[:]...)
	}
	data = appendFrame(data, gen, seq, []byte("the last frame"))
	res, alloc, crc := salvageScan(t, data)
	require.Equal(t, seq, res.lastSeq)
	require.Len(t, res.salvaged, int(seq-1))
	limit := uint64(3*len(data) + 16<<20)
	require.LessOrEqual(t, alloc, limit, "bytes allocated by a salvage of %d crafted stretches in a file of %d", seq-1, len(data))
	require.LessOrEqual(t, crc, 3*len(data))
}
