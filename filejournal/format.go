package filejournal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Format constants of version 1.1 (see the package doc).
const (
	// headerSize is the size of the file header.
	headerSize = 32
	// frameHeaderSize is the size of a frame's CRC, length and sequence.
	frameHeaderSize = 16
	// maxPayload caps a frame's payload. The decoder rejects larger lengths
	// before allocating anything, so a flipped length bit cannot make
	// recovery allocate gigabytes; the committer splits larger batches.
	maxPayload = 1 << 20

	magic        = "IDEMJRNL"
	versionMajor = 1
	// versionMinor is 1 since keys' forms are recorded (flagKeyForm); a
	// reader goes by the flags, not by the minor version.
	versionMinor = 1

	// flagHashedIDs: action ids are SHA-256 digests of the caller's ids.
	flagHashedIDs uint16 = 1
	// flagSeen: the file holds observed times (every upsert with
	// upsertSeen, opSeen records). Every file of this format has it: a file
	// without it was written before observed times, and is refused as
	// incompatible (journal.ErrIncompatible).
	flagSeen uint16 = 2
	// flagKeyForm: every upsert may carry its key's form (upsertForm),
	// since format 1.1. Releases of format 1.0 do not know the flag, so
	// they refuse the file as incompatible (journal.ErrIncompatible)
	// rather than read the forms as damage, or send a key in the other
	// form. A file without it (format 1.0) is read with every form
	// unrecorded, and rewritten with the flag by Open before anything is
	// appended to it (see tidy).
	flagKeyForm uint16 = 4
	knownFlags         = flagHashedIDs | flagSeen | flagKeyForm
	// formatFlags are the flags of every file this version writes, but
	// for flagHashedIDs.
	formatFlags = flagSeen | flagKeyForm

	crcMaskDelta = 0xa282ead8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is the 32-byte file header:
//
//	magic (8) | major (1) | minor (1) | flags (2) | generation (4) |
//	base sequence (8) | reserved, zero (4) | CRC32C of bytes 0-27 (4)
type header struct {
	minor   uint8
	flags   uint16
	gen     uint32
	baseSeq uint64
}

var (
	errBadHeader   = errors.New("bad file header")
	errVersion     = errors.New("unknown major format version")
	errUnknownFlag = errors.New("unknown header flags")
	errNoSeen      = errors.New("written without observed times, by an earlier version of the format")
)

func (h header) append(b []byte) []byte {
	b = append(b, magic...)
	b = append(b, versionMajor, h.minor)
	b = binary.LittleEndian.AppendUint16(b, h.flags)
	b = binary.LittleEndian.AppendUint32(b, h.gen)
	b = binary.LittleEndian.AppendUint64(b, h.baseSeq)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[len(b)-28:], castagnoli))
}

// parseHeader checks the magic and CRC first, so that a damaged version byte
// reads as damage, not as a newer version.
func parseHeader(b []byte) (header, error) {
	if len(b) < headerSize || string(b[:8]) != magic {
		return header{}, errBadHeader
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:32]) {
		return header{}, errBadHeader
	}
	if b[8] != versionMajor {
		return header{}, errVersion
	}
	h := header{
		minor:   b[9],
		flags:   binary.LittleEndian.Uint16(b[10:12]),
		gen:     binary.LittleEndian.Uint32(b[12:16]),
		baseSeq: binary.LittleEndian.Uint64(b[16:24]),
	}
	if h.baseSeq == 0 {
		return header{}, errBadHeader
	}
	if h.flags&^knownFlags != 0 {
		return header{}, errUnknownFlag
	}
	if h.flags&flagSeen == 0 {
		return header{}, errNoSeen
	}
	return h, nil
}

func maskCRC(c uint32) uint32 { return ((c >> 15) | (c << 17)) + crcMaskDelta }

// frameCRC is the masked CRC32C, seeded with the generation, of a frame's
// length, sequence and payload.
func frameCRC(gen uint32, lenSeq []byte, payload []byte) uint32 {
	c := crc32.Update(gen, castagnoli, lenSeq)
	return maskCRC(crc32.Update(c, castagnoli, payload))
}

// appendFrame appends a frame holding payload to dst.
func appendFrame(dst []byte, gen uint32, seq uint64, payload []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	dst = binary.LittleEndian.AppendUint64(dst, seq)
	dst = append(dst, payload...)
	binary.LittleEndian.PutUint32(dst[start:], frameCRC(gen, dst[start+4:start+16], payload))
	return dst
}

// frameWriter encodes operations into frames of generation gen, numbered
// from seq, each with at most maxPayload bytes of payload, and hands each
// whole frame to emit, which writes it. The committer's batches and
// compaction's snapshots are written through it.
type frameWriter struct {
	gen     uint32
	seq     uint64 // the next frame's sequence
	emit    func(frame []byte) error
	recs    []byte // the encoded operations of the frame being built
	count   int    // how many
	payload []byte // scratch
	frame   []byte // scratch, passed to emit
}

// add adds o to the frame being built, emitting that frame first if o
// would make it too long.
func (w *frameWriter) add(o *op) error {
	n := len(w.recs)
	w.recs = appendOp(w.recs, o)
	if len(w.recs)+binary.MaxVarintLen64 > maxPayload { // the count comes first
		w.recs = w.recs[:n]
		if err := w.flush(); err != nil {
			return err
		}
		w.recs = appendOp(w.recs, o)
	}
	w.count++
	return nil
}

// flush emits the frame being built, if it holds anything.
func (w *frameWriter) flush() error {
	if w.count == 0 {
		return nil
	}
	w.payload = binary.AppendUvarint(w.payload[:0], uint64(w.count))
	w.payload = append(w.payload, w.recs...)
	w.frame = appendFrame(w.frame[:0], w.gen, w.seq, w.payload)
	w.recs, w.count = w.recs[:0], 0
	if err := w.emit(w.frame); err != nil {
		return err
	}
	w.seq++
	return nil
}

// write adds ops and emits them, in as few frames as maxPayload allows.
func (w *frameWriter) write(ops ...op) error {
	for i := range ops {
		if err := w.add(&ops[i]); err != nil {
			return err
		}
	}
	return w.flush()
}

// frameAt decodes the frame at data[off:]. ok is false when the frame is
// short, over-long or fails its CRC; it never allocates.
func frameAt(data []byte, off int, gen uint32) (seq uint64, payload []byte, next int, ok bool) {
	if off < 0 || len(data)-off < frameHeaderSize {
		return 0, nil, 0, false
	}
	h := data[off : off+frameHeaderSize]
	n := binary.LittleEndian.Uint32(h[4:8])
	if n > maxPayload || uint64(len(data)-off-frameHeaderSize) < uint64(n) {
		return 0, nil, 0, false
	}
	payload = data[off+frameHeaderSize : off+frameHeaderSize+int(n)]
	if frameCRC(gen, h[4:16], payload) != binary.LittleEndian.Uint32(h[0:4]) {
		return 0, nil, 0, false
	}
	return binary.LittleEndian.Uint64(h[8:16]), payload, off + frameHeaderSize + int(n), true
}
