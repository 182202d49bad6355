package filejournal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemretry/idemretry/journal"
)

// scanResult is what scanning a whole journal file found.
type scanResult struct {
	hdr     header
	end     int    // offset just past the last good frame
	lastSeq uint64 // sequence of the last good frame, or hdr.baseSeq-1
	frames  int    // good frames
	// torn: bytes after end are a torn tail (nothing new follows).
	torn bool
	// salvaged: damaged ranges that salvage skipped.
	salvaged []*CorruptionError
	// dups: exact copies of earlier frames that were skipped, with new
	// frames after them (see scan).
	dups []span
}

// span is a byte range [off, end) of a file.
type span struct{ off, end int }

// scan reads data, a whole journal file, and calls apply for each good frame
// in order. It implements the recovery rule of the package doc. With salvage
// false, damage to acknowledged data returns a *CorruptionError; with salvage
// true, the damaged range is skipped and reported in the result. apply's
// errors are returned as they are, except errPayload: a frame whose CRC
// holds but whose content is malformed was written that way, so it is
// corruption (salvage skips it).
//
// A valid frame whose sequence was already applied is a copy, not the next
// frame. A byte-identical copy of the applied frame (a write repeated below
// the file system) holds nothing new and is skipped, and counted in dups when
// new frames follow it; the frames after it are read as usual, never cut with
// it. Any other frame out of sequence is damage, judged like a frame that
// fails its CRC. Copies and damage with no new frame after them are a torn
// tail: cutting them loses nothing.
func scan(data []byte, path string, salvage bool, apply func(seq uint64, payload []byte) error) (scanResult, error) {
	hdr, err := parseHeader(data)
	if err != nil {
		if errors.Is(err, errBadHeader) {
			return scanResult{}, &CorruptionError{Path: path, Reason: err.Error()}
		}
		return scanResult{}, fmt.Errorf("%w: %s: %w", journal.ErrIncompatible, path, err)
	}
	res := scanResult{hdr: hdr, end: headerSize, lastSeq: hdr.baseSeq - 1}
	// offs[i] is where frame baseSeq+i starts, or -1 if a salvage skipped
	// it: what a copy is compared with.
	var offs []int
	var pendingDups []span // copies not yet followed by a new frame
	off := headerSize
	for off < len(data) {
		seq, payload, next, ok := frameAt(data, off, hdr.gen)
		if ok && seq == res.lastSeq+1 {
			err := apply(seq, payload)
			if err == nil {
				offs = append(offs, off)
				res.lastSeq, res.end, off = seq, next, next
				res.frames++
				res.dups = append(res.dups, pendingDups...)
				pendingDups = pendingDups[:0]
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
			res.lastSeq, res.end = seq, next
			offs = append(offs, off)
			res.dups = append(res.dups, pendingDups...)
			pendingDups = pendingDups[:0]
			off = next
			continue
		}
		if ok && seq >= hdr.baseSeq && seq <= res.lastSeq {
			if i := seq - hdr.baseSeq; i < uint64(len(offs)) && offs[i] >= 0 &&
				bytes.Equal(data[off:next], data[offs[i]:offs[i]+(next-off)]) {
				pendingDups = append(pendingDups, span{off, next})
				off = next
				continue
			}
		}
		p, pseq := findLater(data, off, hdr.gen, res.lastSeq+1)
		if p < 0 {
			res.torn = true
			return res, nil
		}
		ce := &CorruptionError{Path: path, Offset: int64(off), Length: int64(p - off)}
		if pseq == res.lastSeq+1 {
			// Bytes that belong to no frame, before an intact one: nothing
			// is lost, but the file is not what the writer wrote.
			ce.Reason = fmt.Sprintf("%d bytes that are no frame before frame %d", p-off, pseq)
		} else {
			ce.FirstLostSeq, ce.LastLostSeq = res.lastSeq+1, pseq-1
			ce.Reason = "damaged frame followed by later acknowledged frames"
		}
		if !salvage {
			return res, ce
		}
		res.salvaged = append(res.salvaged, ce)
		for res.lastSeq < pseq-1 {
			offs = append(offs, -1)
			res.lastSeq++
		}
		res.dups = append(res.dups, pendingDups...)
		pendingDups = pendingDups[:0]
		off = p
	}
	if len(pendingDups) > 0 {
		res.torn = true // only copies after the last new frame
	}
	return res, nil
}

// findLater returns the offset and sequence of the first valid frame at or
// after from whose sequence is at least minSeq, or -1. When that sequence is
// above minSeq, the frames in between were damaged after they were synced:
// the writer never writes s+2 before the sync of s+1 returned.
func findLater(data []byte, from int, gen uint32, minSeq uint64) (int, uint64) {
	for p := from; p+frameHeaderSize <= len(data); p++ {
		// Cheap filters before the CRC: a plausible sequence and length.
		seq := binary.LittleEndian.Uint64(data[p+8 : p+16])
		if seq < minSeq || seq-minSeq > uint64(len(data)-from)/frameHeaderSize {
			continue
		}
		if s, _, _, ok := frameAt(data, p, gen); ok && s == seq {
			return p, seq
		}
	}
	return -1, 0
}
