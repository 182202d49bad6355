package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// scanResult is what scanning a whole journal file found.
type scanResult struct {
	hdr     header
	end     int    // offset just past the last good frame
	lastSeq uint64 // sequence of the last good frame, or hdr.baseSeq-1
	frames  int    // good frames
	// torn: bytes after end are a torn tail (nothing valid follows).
	torn bool
	// salvaged: damaged ranges that salvage skipped.
	salvaged []*CorruptionError
}

// scan reads data, a whole journal file, and calls apply for each good frame
// in order. It implements the recovery rule of the package doc. With salvage
// false, damage to acknowledged data returns a *CorruptionError; with salvage
// true, the damaged range is skipped and reported in the result. apply's
// errors are returned as they are, except errPayload: a frame whose CRC
// holds but whose content is malformed was written that way, so it is
// corruption (salvage skips it).
func scan(data []byte, path string, salvage bool, apply func(seq uint64, payload []byte) error) (scanResult, error) {
	hdr, err := parseHeader(data)
	if err != nil {
		if errors.Is(err, errBadHeader) {
			return scanResult{}, &CorruptionError{Path: path, Reason: err.Error()}
		}
		return scanResult{}, fmt.Errorf("%w: %s: %w", ErrIncompatible, path, err)
	}
	res := scanResult{hdr: hdr, end: HeaderSize, lastSeq: hdr.baseSeq - 1}
	off := HeaderSize
	for off < len(data) {
		seq, payload, next, ok := frameAt(data, off, hdr.gen)
		if ok && seq == res.lastSeq+1 {
			err := apply(seq, payload)
			if err == nil {
				res.lastSeq, res.end, off = seq, next, next
				res.frames++
				continue
			}
			if !errors.Is(err, errPayload) {
				return res, err
			}
			ce := &CorruptionError{Path: path, Offset: int64(off), Length: int64(next - off),
				FirstLostSeq: seq, LastLostSeq: seq, Reason: err.Error()}
			if !salvage {
				return res, ce
			}
			res.salvaged = append(res.salvaged, ce)
			res.lastSeq, res.end, off = seq, next, next
			continue
		}
		p, pseq := findLater(data, off, hdr.gen, res.lastSeq+2)
		if p < 0 {
			res.torn = true
			return res, nil
		}
		ce := &CorruptionError{Path: path, Offset: int64(off), Length: int64(p - off),
			FirstLostSeq: res.lastSeq + 1, LastLostSeq: pseq - 1,
			Reason: "damaged frame followed by later acknowledged frames"}
		if !salvage {
			return res, ce
		}
		res.salvaged = append(res.salvaged, ce)
		res.lastSeq, off = pseq-1, p
	}
	return res, nil
}

// findLater returns the offset and sequence of the first valid frame at or
// after from whose sequence is at least minSeq, or -1. Such a frame proves
// that the damage before it was synced: the writer never writes s+2 before
// the sync of s+1 returned.
func findLater(data []byte, from int, gen uint32, minSeq uint64) (int, uint64) {
	for p := from; p+FrameHeaderSize <= len(data); p++ {
		// Cheap filters before the CRC: a plausible sequence and length.
		seq := binary.LittleEndian.Uint64(data[p+8 : p+16])
		if seq < minSeq || seq-minSeq > uint64(len(data)-from)/FrameHeaderSize {
			continue
		}
		if s, _, _, ok := frameAt(data, p, gen); ok && s == seq {
			return p, seq
		}
	}
	return -1, 0
}
