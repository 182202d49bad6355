package filejournal

// The search for a later frame after damage (findLater) tries a candidate
// frame at every byte offset that passes its cheap filters, and checking
// one means a CRC over its whole length, up to maxPayload. Crafted bytes
// can make every 16th offset such a candidate: a CRC of a megabyte for
// every 16 bytes of file. crcPrefix checks a long candidate's CRC in
// constant time instead, from the CRC-32C register over the file's bytes
// up to each offset, computed once per byte: the CRC of any stretch follows
// from the registers at its two ends (CRC-32C is linear), so the search
// costs a small multiple of the file whatever its bytes.

// castagnoliPoly is CRC-32C's polynomial, reflected, as hash/crc32 uses it.
const castagnoliPoly = 0x82f63b78

// crcDirectMax is the longest candidate findLater checks with a plain CRC
// over its bytes; longer ones are checked through a crcPrefix first.
const crcDirectMax = 512

// mulModP multiplies a and b, polynomials modulo castagnoliPoly in the
// reflected representation (bit 31 is x^0), as zlib's multmodp does.
func mulModP(a, b uint32) uint32 {
	m, p := uint32(1)<<31, uint32(0)
	for a != 0 {
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ castagnoliPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2n holds x^(2^k) modulo the polynomial, k = 0..63.
var x2n = func() (t [64]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = mulModP(p, p)
	}
	return t
}()

// shiftBytes returns the CRC register r after n zero bytes: r times
// x^(8n) modulo the polynomial.
func shiftBytes(r uint32, n int) uint32 {
	for k := 3; n > 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			r = mulModP(x2n[k&63], r)
		}
	}
	return r
}

// crcPrefix holds g(i), the raw CRC-32C register (no inversions) after the
// bytes [start, i) of a source, for i in [lo, hi], in a ring.
type crcPrefix struct {
	src    *source
	lo, hi int
	ring   []uint32
	buf    []byte
}

// prefixRing is the ring's length: a whole frame's span and a read's.
const prefixRing = frameHeaderSize + maxPayload + prefixChunk + 1

const prefixChunk = 64 << 10

func newCRCPrefix(src *source, start int) *crcPrefix {
	return &crcPrefix{src: src, lo: start, hi: start, ring: make([]uint32, prefixRing)}
}

// restart makes c cover the bytes from start on, as newCRCPrefix does,
// reusing its ring.
func (c *crcPrefix) restart(start int) {
	c.lo, c.hi = start, start
	c.ring[start%prefixRing] = 0
}

// reach extends g up to i (at most size), forgetting what is before lo.
func (c *crcPrefix) reach(i int) error {
	g := c.ring[c.hi%prefixRing]
	for c.hi < i {
		n := min(prefixChunk, i-c.hi)
		var b []byte
		if c.src.inMem {
			b = c.src.mem[c.hi : c.hi+n]
		} else {
			if cap(c.buf) < n {
				c.buf = make([]byte, prefixChunk)
			}
			b = c.buf[:n]
			if err := readFull(c.src.r, b, c.hi); err != nil {
				return err
			}
		}
		for _, v := range b {
			g = castagnoli[byte(g)^v] ^ g>>8
			c.hi++
			c.ring[c.hi%prefixRing] = g
		}
	}
	return nil
}

// frameCRCAt returns frameCRC of the frame of generation gen at off with a
// payload of n bytes (that fit in the source), from the registers. Offsets
// must not go down from call to call.
func (c *crcPrefix) frameCRCAt(off, n int, gen uint32) (uint32, error) {
	a, b := off+4, off+frameHeaderSize+n // the CRC covers [a, b)
	c.lo = max(c.lo, a)
	if err := c.reach(b); err != nil {
		return 0, err
	}
	// crc32.Update(gen, X) = ^g'(^gen, X), where g' runs the register from
	// ^gen over X: the shift of ^gen by len(X) bytes, xor the register run
	// from zero over X, which is g(b) xor the shift of g(a).
	ga, gb := c.ring[a%prefixRing], c.ring[b%prefixRing]
	return maskCRC(^(shiftBytes(^gen^ga, b-a) ^ gb)), nil
}
