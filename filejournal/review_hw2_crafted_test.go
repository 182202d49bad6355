package filejournal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The crafted-input part of hW2's review of the file journal: recovery's
// search for a later frame after damage (findLater) must do work in
// proportion to the file, whatever its bytes.

// hw2Candidates returns a journal file of about n bytes: a valid header of
// generation gen, then, every 16 bytes, a frame header that passes
// findLater's cheap filters (a plausible sequence; length, at most
// maxPayload, for its payload's) and fails its CRC.
func hw2Candidates(n int, gen, length uint32) []byte {
	b := header{minor: versionMinor, flags: flagSeen, gen: gen, baseSeq: 1}.append(nil)
	for len(b) < n {
		var h [16]byte
		binary.LittleEndian.PutUint32(h[0:4], 0xdeadbeef)
		binary.LittleEndian.PutUint32(h[4:8], length)
		binary.LittleEndian.PutUint64(h[8:16], 2)
		b = append(b, h[:]...)
	}
	return b
}

// TestHW2SearchWorkBoundedOnCraftedBytes: 2 MiB whose every 16 bytes look
// like the header of a 1 MiB frame made findLater run a CRC over 1 MiB for
// each, some 65,000 of them (3.7 s for 2 MiB here, and linear in the file
// from there, about 3 minutes for 100 MiB, where a real journal of that
// size opens in a fraction of a second). The scan's verdict is unchanged (a
// torn tail: nothing valid follows) and its CRC work stays within a small
// multiple of the file.
func TestHW2SearchWorkBoundedOnCraftedBytes(t *testing.T) {
	data := hw2Candidates(2<<20, 7, maxPayload)
	for _, src := range []*source{memSource(data), readerSource(t, data, windowSize)} {
		res, err := scanSource(src, "j", false, func(uint64, []byte) error { return nil })
		require.NoError(t, err)
		require.True(t, res.torn)
		require.Equal(t, headerSize, res.end)
		require.LessOrEqual(t, src.crcBytes, 40*len(data), "bytes run through a CRC by the search, for a file of %d", len(data))
	}
}

// TestHW2PrefixCRCMatchesFrameCRC: the CRC a crcPrefix derives for a
// stretch of a source is the one frameCRC computes over its bytes, at any
// offset and length (up to maxPayload), rising offsets, through memory and
// through a file's reads.
func TestHW2PrefixCRCMatchesFrameCRC(t *testing.T) {
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

// TestHW2LongFrameAfterCraftedBytesFound: a valid frame with a long payload
// after the crafted candidates is found as before: the next frame after
// them is "bytes that are no frame" (FirstLostSeq 0, nothing lost), a later
// one is acknowledged data lost; with salvage, the frame is applied.
func TestHW2LongFrameAfterCraftedBytesFound(t *testing.T) {
	const gen = 99
	junk := hw2Candidates(300<<10, gen, 64<<10) // each a candidate of 64 KiB
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
