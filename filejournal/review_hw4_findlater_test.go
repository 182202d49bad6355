package filejournal

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// hW4's review of hW2's constant-time CRC check in findLater: its verdicts,
// end to end, must be those of the direct CRC it replaced, on files of many
// valid frames of random lengths (short, just over crcDirectMax, long,
// exactly maxPayload), frames nested in other frames' payloads (candidates
// that overlap earlier ones), frames of another generation, copies, and
// damage injected at random.

// hw4DirectFindLater is findLater as it was before crcprefix.go: every
// candidate through the plain frame check.
func hw4DirectFindLater(s *source, from int, gen uint32, minSeq uint64) (int, uint64, error) {
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

// hw4File returns a journal file of generation gen and its frames' offsets.
func hw4File(rng *rand.Rand, gen uint32, base uint64, frames int, big bool) ([]byte, []int) {
	data := header{minor: versionMinor, flags: flagSeen, gen: gen, baseSeq: base}.append(nil)
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

// hw4Damage damages data at random: bit flips, overwritten stretches,
// bytes cut out, junk put in (some of it a frame header with a plausible
// sequence and a long length).
func hw4Damage(rng *rand.Rand, data []byte, gen uint32, base uint64, times int) []byte {
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

func TestHW4FindLaterMatchesDirectCRC(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	rounds := 4
	if testing.Short() || hw4Race {
		rounds = 2
	}
	found, long := 0, 0
	for round := range rounds {
		gen := rng.Uint32()
		if round == 0 {
			gen = 0
		}
		base := 1 + uint64(rng.IntN(1000))
		data, offs := hw4File(rng, gen, base, 30+rng.IntN(30), round%3 == 0 && !hw4Race)
		if round%2 == 1 {
			data = hw4Damage(rng, data, gen, base, 1+rng.IntN(8))
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
				wp, wseq, err := hw4DirectFindLater(ref, from, gen, minSeq)
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
