package filejournal

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// hW4's review of hW2's constant-time CRC check in findLater, across
// calls: a salvage (WithSalvage) calls findLater once per damaged stretch,
// and each call made its own crcPrefix, a ring of 4.4 MB, and ran it over
// the candidate's whole length. The work of a salvage must stay within a
// small multiple of the file however many damaged stretches it has.

// hw4Salvage scans data with salvage, through memory and a file, and
// returns the last scan's result and, for the scans, the bytes allocated
// and the bytes the search ran its direct CRC over, at most.
func hw4Salvage(t *testing.T, data []byte) (res scanResult, alloc uint64, crc int) {
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

// TestHW4SalvageOfManyDamagedFramesBounded: a journal of frames of 600 to
// 1600 bytes (batches of a few records) with a bit flipped in every tenth
// frame: each damaged frame is salvaged, and the salvage allocates a small
// multiple of the file, not a ring per damaged frame.
func TestHW4SalvageOfManyDamagedFramesBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 9))
	const gen = 7
	data := header{minor: versionMinor, flags: flagSeen, gen: gen, baseSeq: 1}.append(nil)
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
	res, alloc, crc := hw4Salvage(t, data)
	require.Len(t, res.salvaged, damaged)
	require.Equal(t, uint64(len(offs)), res.lastSeq)
	limit := uint64(3*len(data) + 16<<20)
	require.LessOrEqual(t, alloc, limit, "bytes allocated by a salvage of %d damaged frames in a file of %d", damaged, len(data))
	require.LessOrEqual(t, crc, 3*len(data))
}

// TestHW4SalvageOfCraftedStretchesBounded: valid short frames, each
// followed by 16 bytes that look like the header of a long frame (a
// plausible sequence and length, a wrong CRC): every one is a damaged
// stretch, a findLater call whose first candidate is long. The salvage's
// work and allocation stay within a small multiple of the file.
func TestHW4SalvageOfCraftedStretchesBounded(t *testing.T) {
	const gen = 5
	data := header{minor: versionMinor, flags: flagSeen, gen: gen, baseSeq: 1}.append(nil)
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
	res, alloc, crc := hw4Salvage(t, data)
	require.Equal(t, seq, res.lastSeq)
	require.Len(t, res.salvaged, int(seq-1))
	limit := uint64(3*len(data) + 16<<20)
	require.LessOrEqual(t, alloc, limit, "bytes allocated by a salvage of %d crafted stretches in a file of %d", seq-1, len(data))
	require.LessOrEqual(t, crc, 3*len(data))
}
