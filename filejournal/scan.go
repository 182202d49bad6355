package filejournal

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"

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

// scanSource reads src, a whole journal file, and calls apply for each good
// frame in order. It implements the recovery rule of the package doc. With
// salvage false, damage to acknowledged data returns a *CorruptionError;
// with salvage true, the damaged range is skipped and reported in the
// result. apply's errors are returned as they are, except errPayload: a
// frame whose CRC holds but whose content is malformed was written that way,
// so it is corruption (salvage skips it). An error reading src is returned
// as it is, before anything is judged from the bytes it did not give. The
// payload passed to apply is valid only until apply returns when src is a
// file.
//
// A valid frame whose sequence was already applied is a copy, not the next
// frame. A byte-identical copy of the applied frame (a write repeated below
// the file system) holds nothing new and is skipped, and counted in dups when
// new frames follow it; the frames after it are read as usual, never cut with
// it. Any other frame out of sequence is damage, judged like a frame that
// fails its CRC. Copies and damage with no new frame after them are a torn
// tail: cutting them loses nothing.
func scanSource(src *source, path string, salvage bool, apply func(seq uint64, payload []byte) error) (scanResult, error) {
	hb, err := src.bytes(0, headerSize)
	if err != nil {
		return scanResult{}, err
	}
	hdr, err := parseHeader(hb)
	if err != nil {
		if errors.Is(err, errBadHeader) {
			return scanResult{}, &CorruptionError{Path: path, Reason: err.Error()}
		}
		return scanResult{}, fmt.Errorf("%w: %s: %w", journal.ErrIncompatible, path, err)
	}
	sc := &scanner{src: src, path: path, salvage: salvage, apply: apply,
		res: scanResult{hdr: hdr, end: headerSize, lastSeq: hdr.baseSeq - 1}}
	off := headerSize
	for off < src.size {
		seq, payload, next, ok, err := src.frame(off, hdr.gen)
		if err != nil {
			return sc.res, err
		}
		if ok && seq == sc.res.lastSeq+1 {
			if err := sc.take(off, seq, payload, next); err != nil {
				return sc.res, err
			}
			off = next
			continue
		}
		if ok {
			copied, err := sc.isCopy(off, seq, next)
			if err != nil {
				return sc.res, err
			}
			if copied {
				sc.pendingDups = append(sc.pendingDups, span{off, next})
				off = next
				continue
			}
		}
		if off, err = sc.skipDamage(off); err != nil || off < 0 {
			return sc.res, err
		}
	}
	if len(sc.pendingDups) > 0 {
		sc.res.torn = true // only copies after the last new frame
	}
	return sc.res, nil
}

// scanner is scanSource's state: what it found so far (res), where each
// frame from the header's base sequence on starts, or -1 if a salvage
// skipped it (offs: what a copy is compared with), and the copies not yet
// followed by a new frame (pendingDups).
type scanner struct {
	src         *source
	path        string
	salvage     bool
	apply       func(seq uint64, payload []byte) error
	res         scanResult
	offs        offsets
	pendingDups []span
}

// take applies the next frame, of sequence seq at off up to next. A
// payload that apply finds malformed (errPayload) was written that way:
// corruption, which salvage skips.
func (sc *scanner) take(off int, seq uint64, payload []byte, next int) error {
	if err := sc.apply(seq, payload); err != nil {
		if !errors.Is(err, errPayload) {
			return err
		}
		ce := &CorruptionError{Path: sc.path, Offset: int64(off), Length: int64(next - off),
			FirstLostSeq: seq, LastLostSeq: seq, Reason: err.Error()}
		sc.named(ce, payload)
		if !sc.salvage {
			return ce
		}
		sc.res.salvaged = append(sc.res.salvaged, ce)
	} else {
		sc.res.frames++
	}
	sc.offs.add(off)
	sc.res.lastSeq, sc.res.end = seq, next
	sc.keepDups()
	return nil
}

// keepDups counts the copies met since the last new frame: one followed
// them.
func (sc *scanner) keepDups() {
	sc.res.dups = append(sc.res.dups, sc.pendingDups...)
	sc.pendingDups = sc.pendingDups[:0]
}

// isCopy reports whether the valid frame at off, up to next, of an already
// applied sequence seq, is a byte-identical copy of the frame applied
// with it.
func (sc *scanner) isCopy(off int, seq uint64, next int) (bool, error) {
	base := sc.res.hdr.baseSeq
	if seq < base || seq > sc.res.lastSeq {
		return false, nil
	}
	i := seq - base
	if i >= uint64(sc.offs.len()) || sc.offs.at(int(i)) < 0 {
		return false, nil
	}
	return sc.src.equal(off, sc.offs.at(int(i)), next-off)
}

// skipDamage judges the bytes at off, which are not the next frame: with
// no later frame after them, a torn tail (it returns -1); else damage,
// returned as a *CorruptionError, or, with salvage, skipped (it returns
// the offset of the frame after it).
func (sc *scanner) skipDamage(off int) (int, error) {
	res := &sc.res
	p, pseq, err := sc.src.findLater(off, res.hdr.gen, res.lastSeq+1)
	if err != nil {
		return -1, err
	}
	if p < 0 {
		res.torn = true
		return -1, nil
	}
	ce := &CorruptionError{Path: sc.path, Offset: int64(off), Length: int64(p - off)}
	if pseq == res.lastSeq+1 {
		// Bytes that belong to no frame, before an intact one: nothing
		// is lost, but the file is not what the writer wrote.
		ce.Reason = fmt.Sprintf("%d bytes that are no frame before frame %d", p-off, pseq)
	} else {
		ce.FirstLostSeq, ce.LastLostSeq = res.lastSeq+1, pseq-1
		ce.Reason = "damaged frame followed by later acknowledged frames"
		if err := sc.damagedActions(ce, off, p); err != nil {
			return -1, err
		}
	}
	if !sc.salvage {
		return -1, ce
	}
	res.salvaged = append(res.salvaged, ce)
	for res.lastSeq < pseq-1 {
		sc.offs.add(-1)
		res.lastSeq++
	}
	sc.keepDups()
	return p, nil
}

// damagedActions adds to ce the actions named in the damaged frames from
// off to end (see named), found by their length fields: a length that
// does not fit ends the walk.
func (sc *scanner) damagedActions(ce *CorruptionError, off, end int) error {
	for off+frameHeaderSize <= end {
		h, err := sc.src.bytes(off, frameHeaderSize)
		if err != nil {
			return err
		}
		n := int(binary.LittleEndian.Uint32(h[4:8]))
		if n > maxPayload || n > end-off-frameHeaderSize {
			break
		}
		payload, err := sc.src.bytes(off+frameHeaderSize, n)
		if err != nil {
			return err
		}
		sc.named(ce, payload)
		off += frameHeaderSize + n
	}
	return nil
}

// named adds to ce the upserts of the damaged payload p (damagedUpserts),
// and their ids, in the form Unfinished reports, to ce.Actions, each once.
func (sc *scanner) named(ce *CorruptionError, p []byte) {
	for _, u := range damagedUpserts(p) {
		ce.upserts = append(ce.upserts, u)
		id := u.id
		if sc.res.hdr.flags&flagHashedIDs != 0 {
			id = journal.DigestPrefix + hex.EncodeToString([]byte(id))
		}
		if !slices.Contains(ce.Actions, id) {
			ce.Actions = append(ce.Actions, id)
		}
	}
}

// findLater returns the offset and sequence of the first valid frame at or
// after from whose sequence is at least minSeq, or -1. When that sequence is
// above minSeq, the frames in between were damaged after they were synced:
// the writer never writes s+2 before the sync of s+1 returned.
//
// A candidate longer than crcDirectMax is checked through a crcPrefix first
// (in constant time), so that bytes crafted to hold a plausible frame
// header every few bytes cannot make the search cost a CRC over a megabyte
// for each.
func (s *source) findLater(from int, gen uint32, minSeq uint64) (int, uint64, error) {
	for p := from; p+frameHeaderSize <= s.size; p++ {
		h, err := s.bytes(p, frameHeaderSize)
		if err != nil {
			return -1, 0, err
		}
		// Cheap filters before the CRC: a plausible sequence and length.
		seq := binary.LittleEndian.Uint64(h[8:16])
		if seq < minSeq || seq-minSeq > uint64(s.size-from)/frameHeaderSize {
			continue
		}
		n := binary.LittleEndian.Uint32(h[4:8])
		if n > maxPayload || int(n) > s.size-p-frameHeaderSize {
			continue // frame would refuse it before its CRC
		}
		if n > crcDirectMax {
			want := binary.LittleEndian.Uint32(h[0:4])
			// One crcPrefix for the source, made at its first long
			// candidate and kept from call to call (a salvage calls
			// once per damaged stretch), so that each byte is run
			// through it about once; restarted at a candidate past
			// what it covers.
			if s.pre == nil {
				s.pre = newCRCPrefix(s, p)
			} else if p+4 < s.pre.lo || p >= s.pre.hi {
				s.pre.restart(p)
			}
			c, err := s.pre.frameCRCAt(p, int(n), gen)
			if err != nil {
				return -1, 0, err
			}
			if c != want {
				continue
			}
		}
		s.crcBytes += 12 + int(n)
		if got, _, _, ok, err := s.frame(p, gen); err != nil {
			return -1, 0, err
		} else if ok && got == seq {
			return p, seq, nil
		}
	}
	return -1, 0, nil
}

// offsets is an append-only list of file offsets, kept in fixed-size chunks
// so that a long journal's list never grows by copying.
type offsets struct {
	chunks [][]int
	n      int
}

const offsetsChunk = 4096

func (o *offsets) add(off int) {
	if o.n%offsetsChunk == 0 {
		o.chunks = append(o.chunks, make([]int, 0, offsetsChunk))
	}
	c := &o.chunks[len(o.chunks)-1]
	*c = append(*c, off)
	o.n++
}

func (o *offsets) len() int     { return o.n }
func (o *offsets) at(i int) int { return o.chunks[i/offsetsChunk][i%offsetsChunk] }

// source is a journal file to scan: either its bytes, all in memory, or the
// open file, read through one window that is reused from frame to frame, so
// that scanning a file holds at most a couple of frames of it in memory
// (recovery of a large journal does not hold the whole file as well as its
// index).
type source struct {
	size  int
	inMem bool
	mem   []byte      // the whole file, when inMem
	r     io.ReaderAt // the file, when not
	win   int         // how much to read at a time
	buf   []byte      // the window: bytes [at, at+len(buf)) of the file
	at    int
	other []byte // scratch for the earlier frame that a copy is compared with
	// crcBytes counts the bytes that findLater's checks of candidate
	// frames ran a CRC over, for tests: the work of a search.
	crcBytes int
	pre      *crcPrefix // findLater's, made at its first long candidate
}

// windowSize is how much of a file a source reads at a time: room for a
// whole frame of the largest payload, and a quarter megabyte more, so that
// the window never grows and, with frames of a few kilobytes, moves about
// once per megabyte.
const windowSize = frameHeaderSize + maxPayload + 256<<10

func memSource(data []byte) *source { return &source{size: len(data), inMem: true, mem: data} }

func fileSource(r io.ReaderAt, size int64) (*source, error) {
	if size < 0 || size > math.MaxInt-windowSize {
		return nil, fmt.Errorf("file size %d out of range", size)
	}
	return &source{size: int(size), r: r, win: windowSize}, nil
}

// bytes returns the file's bytes [off, off+n), cut short at the end of the
// file, with 0 <= off <= size. For a file, they are valid until the next
// call.
func (s *source) bytes(off, n int) ([]byte, error) {
	end := s.size
	if n < end-off {
		end = off + n
	}
	if s.inMem {
		return s.mem[off:end], nil
	}
	if off >= s.at && end <= s.at+len(s.buf) {
		return s.buf[off-s.at : end-s.at], nil
	}
	// Move the window to off: keep what it holds from off on, and read
	// the rest.
	want := min(max(s.win, end-off), s.size-off)
	buf := s.buf
	if cap(buf) < want {
		buf = make([]byte, want)
	}
	buf = buf[:want]
	k := 0
	if off >= s.at && off < s.at+len(s.buf) {
		k = copy(buf, s.buf[off-s.at:])
	}
	if err := readFull(s.r, buf[k:], off+k); err != nil {
		s.buf, s.at = buf[:0], 0
		return nil, err
	}
	s.buf, s.at = buf, off
	return buf[:end-off], nil
}

// frame decodes the frame at off, as frameAt does; the payload is valid
// until the next call.
func (s *source) frame(off int, gen uint32) (seq uint64, payload []byte, next int, ok bool, err error) {
	h, err := s.bytes(off, frameHeaderSize)
	if err != nil || len(h) < frameHeaderSize {
		return 0, nil, 0, false, err
	}
	n := binary.LittleEndian.Uint32(h[4:8])
	if n > maxPayload || uint64(s.size-off-frameHeaderSize) < uint64(n) {
		return 0, nil, 0, false, nil
	}
	b, err := s.bytes(off, frameHeaderSize+int(n))
	if err != nil {
		return 0, nil, 0, false, err
	}
	seq, payload, next, ok = frameAt(b, 0, gen)
	return seq, payload, off + next, ok, nil
}

// equal reports whether the file's n bytes at a and at b are the same.
func (s *source) equal(a, b, n int) (bool, error) {
	if s.inMem {
		return bytes.Equal(s.mem[a:a+n], s.mem[b:b+n]), nil
	}
	if cap(s.other) < n {
		s.other = make([]byte, n)
	}
	o := s.other[:n]
	if err := readFull(s.r, o, b); err != nil {
		return false, err
	}
	x, err := s.bytes(a, n)
	if err != nil {
		return false, err
	}
	return bytes.Equal(x, o), nil
}

// readFull reads len(p) bytes at off. A file shorter than its size was
// when the scan began is an error (io.ErrUnexpectedEOF), not an end.
func readFull(r io.ReaderAt, p []byte, off int) error {
	n, err := r.ReadAt(p, int64(off))
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read journal: %w", err)
}

// openSource returns a source reading f, of its size now.
func openSource(f *os.File) (*source, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return fileSource(f, fi.Size())
}
