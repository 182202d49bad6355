package journal

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Format constants of version 1.
const (
	// HeaderSize is the size of the file header.
	HeaderSize = 32
	// FrameHeaderSize is the size of a frame's CRC, length and sequence.
	FrameHeaderSize = 16
	// MaxPayload caps a frame's payload. The decoder rejects larger lengths
	// before allocating anything, so a flipped length bit cannot make
	// recovery allocate gigabytes; the committer splits larger batches.
	MaxPayload = 1 << 20

	magic        = "IDEMJRNL"
	versionMajor = 1
	versionMinor = 0

	// flagHashedIDs: action ids are SHA-256 digests of the caller's ids.
	flagHashedIDs uint16 = 1
	// flagSeen: the file holds observed times (upserts with upsertSeen,
	// opSeen records). Versions that expire by the wall clock alone do not
	// know the flag, so they refuse the file as incompatible rather than
	// misread it as corrupt; a file without it is rewritten with it at open.
	flagSeen   uint16 = 2
	knownFlags        = flagHashedIDs | flagSeen

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
	if len(b) < HeaderSize || string(b[:8]) != magic {
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

// frameAt decodes the frame at data[off:]. ok is false when the frame is
// short, over-long or fails its CRC; it never allocates.
func frameAt(data []byte, off int, gen uint32) (seq uint64, payload []byte, next int, ok bool) {
	if off < 0 || len(data)-off < FrameHeaderSize {
		return 0, nil, 0, false
	}
	h := data[off : off+FrameHeaderSize]
	n := binary.LittleEndian.Uint32(h[4:8])
	if n > MaxPayload || uint64(len(data)-off-FrameHeaderSize) < uint64(n) {
		return 0, nil, 0, false
	}
	payload = data[off+FrameHeaderSize : off+FrameHeaderSize+int(n)]
	if frameCRC(gen, h[4:16], payload) != binary.LittleEndian.Uint32(h[0:4]) {
		return 0, nil, 0, false
	}
	return binary.LittleEndian.Uint64(h[8:16]), payload, off + FrameHeaderSize + int(n), true
}
