package idemretry

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/cpu"

	"github.com/idemretry/idemretry/journal"
)

// A request's fingerprint tells whether two requests are one payload
// (guarantee 9). It has one of two forms, both in journal.Fingerprint's 32
// bytes:
//
//   - plain: SHA-256(method 0 URL 0 SHA-256(body)). Unnamed requests have
//     it (it names their action, so every process must compute the same),
//     and so do redirect hops (8 of its bytes name the hop), small bodies,
//     bodies of unknown length, CPUs without AES and carry-less multiply
//     instructions, and every record of the releases before the keyed form.
//   - keyed: keyedMagic (4 bytes), a secret (12 random bytes) and a digest
//     (16 bytes), for a named action's body of keyedMinBody bytes or more.
//     The digest is a MAC of method, URL and body under the AES-128 key made
//     of the first 16 bytes: each keyedChunk of the body is authenticated
//     with AES-GCM (GHASH, several times SHA-256's speed; the chunk's index
//     is its nonce), and the digest is SHA-256(method 0 URL 0 length
//     SHA-256(tags)), cut to 16 bytes. Without the secret, which only the
//     journal holds, no one can craft a body with another's digest: what a
//     checksum (two CRC-32s were tried) could not promise.
//
// A fingerprint is checked against a request by computing the request's in
// the same form, with the same secret (matchFingerprint): the journal's
// record and a flight's leader may each have drawn their own.
const (
	keyedMinBody = 64 << 10 // smaller bodies: SHA-256 costs less than the key's set-up
	keyedChunk   = 64 << 10
)

// keyedMagic begins a keyed fingerprint. A plain one begins with it by
// chance once in 2^32; matchFingerprint checks such a one in both forms.
var keyedMagic = [4]byte{'i', 'r', 'k', 1}

// keyedHardware: this CPU runs AES-GCM in hardware, where the keyed form
// is the faster. Set at initialisation, never changed.
var keyedHardware = (runtime.GOARCH == "amd64" && cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSSE3) ||
	(runtime.GOARCH == "arm64" && cpu.ARM64.HasAES && cpu.ARM64.HasPMULL)

// isKeyed reports whether fp has the keyed form.
func isKeyed(fp journal.Fingerprint) bool { return [4]byte(fp[:4]) == keyedMagic }

// newFingerprint returns the fingerprint of req for a new record of its
// action: keyed when keyable (a named action's first hop) and its body
// known to be large, on hardware where that is the faster; plain otherwise.
func newFingerprint(req *http.Request, b *body, keyable bool) (journal.Fingerprint, error) {
	if !keyable || !keyedHardware || b.size(req) < keyedMinBody {
		return fingerprint(req, b)
	}
	var head journal.Fingerprint
	copy(head[:], keyedMagic[:])
	if _, err := io.ReadFull(rand.Reader, head[len(keyedMagic):16]); err != nil {
		return journal.Fingerprint{}, fmt.Errorf("fingerprint secret: %w", err)
	}
	fp, err := keyedFingerprint(req, b, head)
	if err == errNoGCM {
		return fingerprint(req, b) // AES-GCM refused (GODEBUG=fips140=only): the plain form
	}
	return fp, err
}

// matchFingerprint computes req's fingerprint in want's form (with want's
// secret when keyed) and reports whether it is want.
func matchFingerprint(req *http.Request, b *body, want journal.Fingerprint) (journal.Fingerprint, bool, error) {
	var keyedErr error
	if isKeyed(want) {
		fp, err := keyedFingerprint(req, b, want)
		if err == nil && fp == want {
			return fp, true, nil
		}
		if err != errNoGCM && err != nil {
			return journal.Fingerprint{}, false, err
		}
		keyedErr = err // a plain one that begins with keyedMagic is checked below
	}
	fp, err := fingerprint(req, b)
	if err != nil {
		return journal.Fingerprint{}, false, err
	}
	if fp != want && keyedErr != nil {
		return journal.Fingerprint{}, false, keyedErr // cannot be checked here
	}
	return fp, fp == want, nil
}

// errNoGCM: the runtime refused AES-GCM (GODEBUG=fips140=only).
var errNoGCM = errors.New("idemretry: AES-GCM is not available (GODEBUG=fips140=only?): a keyed fingerprint cannot be checked")

// keyedFingerprint returns req's keyed fingerprint under head's first 16
// bytes (keyedMagic and the secret).
func keyedFingerprint(req *http.Request, b *body, head journal.Fingerprint) (journal.Fingerprint, error) {
	block, err := aes.NewCipher(head[:16])
	if err != nil {
		return journal.Fingerprint{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return journal.Fingerprint{}, errNoGCM
	}
	k := keyedScratch.Get().(*keyedHash)
	defer keyedScratch.Put(k)
	k.reset(aead)
	if err := b.hashInto(k); err != nil {
		return journal.Fingerprint{}, err
	}
	k.end()
	buf := append(k.buf[:0], req.Method...)
	buf = append(buf, 0)
	buf = appendURL(buf, req.URL)
	buf = append(buf, 0)
	buf = binary.BigEndian.AppendUint64(buf, k.size)
	buf = k.tags.Sum(buf)
	k.buf = buf
	sum := sha256.Sum256(buf)
	fp := head
	copy(fp[16:], sum[:])
	return fp, nil
}

// keyedHash authenticates a body chunk by chunk for keyedFingerprint. The
// chunks are the body's keyedChunk-byte runs and its remainder, however its
// reader splits it.
type keyedHash struct {
	aead  cipher.AEAD
	tags  hash.Hash // SHA-256 of the chunks' tags, in order
	chunk []byte    // a chunk being filled, of capacity keyedChunk
	n     uint64    // chunks authenticated
	size  uint64    // bytes written
	nonce [12]byte
	tag   []byte
	buf   []byte
}

var keyedScratch = sync.Pool{New: func() any {
	return &keyedHash{tags: sha256.New(), chunk: make([]byte, 0, keyedChunk), tag: make([]byte, 0, 16), buf: make([]byte, 0, 256)}
}}

func (k *keyedHash) reset(aead cipher.AEAD) {
	k.aead, k.n, k.size = aead, 0, 0
	k.tags.Reset()
	k.chunk = k.chunk[:0]
}

func (k *keyedHash) Write(p []byte) (int, error) {
	n := len(p)
	k.size += uint64(n)
	if len(k.chunk) > 0 {
		m := copy(k.chunk[len(k.chunk):keyedChunk], p)
		k.chunk, p = k.chunk[:len(k.chunk)+m], p[m:]
		if len(k.chunk) < keyedChunk {
			return n, nil
		}
		k.seal(k.chunk)
		k.chunk = k.chunk[:0]
	}
	for len(p) >= keyedChunk {
		k.seal(p[:keyedChunk])
		p = p[keyedChunk:]
	}
	k.chunk = append(k.chunk, p...)
	return n, nil
}

// end authenticates the last, partial chunk.
func (k *keyedHash) end() {
	if len(k.chunk) > 0 {
		k.seal(k.chunk)
		k.chunk = k.chunk[:0]
	}
	k.aead = nil
}

func (k *keyedHash) seal(c []byte) {
	binary.BigEndian.PutUint64(k.nonce[4:], k.n)
	k.n++
	k.tag = k.aead.Seal(k.tag[:0], k.nonce[:], nil, c)
	k.tags.Write(k.tag)
}

// fingerprint returns req's plain fingerprint: method, URL and the SHA-256
// of the body (of no bytes when it has none).
func fingerprint(req *http.Request, bd *body) (journal.Fingerprint, error) {
	s := fingerprintScratch.Get().(*fpScratch)
	defer fingerprintScratch.Put(s)
	s.h.Reset()
	if err := bd.hashInto(s.h); err != nil {
		return journal.Fingerprint{}, err
	}
	// The sums go into the scratch buffer: a local array passed to the
	// hash.Hash interface would escape, an allocation per request.
	b := append(s.buf[:0], req.Method...)
	b = append(b, 0)
	b = appendURL(b, req.URL) // the same bytes as URL.String
	b = append(b, 0)
	b = s.h.Sum(b) // the body's SHA-256
	s.buf = b
	// The same SHA-256 as through s.h, on the stack: no Reset, no calls
	// through the interface.
	return sha256.Sum256(b), nil
}

// appendURL appends u.String() to b. The common form of a request URL
// (scheme, host, a path and query that need no escaping, no user, no
// fragment) is appended directly; any other goes through u.String().
func appendURL(b []byte, u *url.URL) []byte {
	if u.Opaque != "" || u.User != nil || u.OmitHost || u.Scheme == "" || u.Host == "" || u.RawPath != "" ||
		u.Fragment != "" || u.RawFragment != "" || !plainURLPart(u.Host, &plainHost) || !plainURLPart(u.Path, &plainPath) ||
		(u.Path != "" && u.Path[0] != '/') {
		return append(b, u.String()...)
	}
	b = append(b, u.Scheme...)
	b = append(b, "://"...)
	b = append(b, u.Host...)
	b = append(b, u.Path...)
	if u.ForceQuery || u.RawQuery != "" {
		b = append(b, '?')
		b = append(b, u.RawQuery...)
	}
	return b
}

// plainURLPart reports whether s holds only bytes of set: letters, digits,
// "-._~" and the bytes plainSet adds for a host or a path, what URL.String
// writes as they are there.
func plainURLPart(s string, set *[256]bool) bool {
	for i := 0; i < len(s); i++ {
		if !set[s[i]] {
			return false
		}
	}
	return true
}

// The bytes URL.String writes as they are in a host and in a path. Set at
// initialisation, never changed.
var plainHost, plainPath = plainSet(":[]"), plainSet("/")

// plainSet returns the letters, digits, "-._~" and the bytes of extra.
func plainSet(extra string) (set [256]bool) {
	for c := 0; c < 256; c++ {
		set[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' ||
			strings.IndexByte(extra, byte(c)) >= 0
	}
	return set
}

// fpScratch is a hash and a buffer reused across fingerprints: the hot path
// of every keyed request.
type fpScratch struct {
	h   hash.Hash
	buf []byte
}

var fingerprintScratch = sync.Pool{New: func() any {
	return &fpScratch{h: sha256.New(), buf: make([]byte, 0, 256)}
}}

func fingerprintActionID(fp journal.Fingerprint) string {
	return fingerprintActionPrefix + hex.EncodeToString(fp[:])
}
