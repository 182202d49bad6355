package idemretry

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"math/rand/v2"
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
//     bodies of unknown length, every request where the journal keeps no
//     secret (journal.FingerprintKeeper) or the CPU has no AES and
//     carry-less multiply instructions, and every record of the releases
//     before the keyed form.
//   - keyed: keyedMagic (4 bytes), the key's id (4), a salt (8 random
//     bytes) and a digest (16), for a named action's body of keyedMinBody
//     bytes or more. The digest is a MAC of method, URL and body under an
//     AES-128 key the Transport derives from its journal's secret
//     (fingerprintKey), which no Record holds: each keyedChunk of the body
//     is authenticated with AES-GCM (GHASH, several times SHA-256's speed;
//     the nonce is the salt and the chunk's index), and the digest is
//     SHA-256(magic id salt method 0 URL 0 length SHA-256(tags)), cut to 16
//     bytes. The id tells a fingerprint made under another secret (a
//     journal's fingerprint.key deleted, a record copied elsewhere), which
//     cannot be checked, from another payload. Without
//     the secret no one can craft a body with another's digest, which a
//     checksum (two CRC-32s were tried) could not promise; GHASH's key must
//     stay secret for that, hence not in the record.
//
// A fingerprint is checked against a request by computing the request's in
// the same form, with the same salt (matchFingerprint): the journal's record
// and a flight's leader may each have drawn their own.
const (
	keyedMinBody = 512 // smaller bodies hash as fast plain (BenchmarkFingerprint)
	keyedChunk   = 64 << 10
)

// keyedMagic begins a keyed fingerprint. A plain one begins with it by
// chance once in 2^32; matchFingerprint checks such a one in both forms.
var keyedMagic = [4]byte{'i', 'r', 'k', 1}

// keyedHardware: this CPU runs AES-GCM in hardware, where the keyed form
// is the faster. Every Apple arm64 CPU has AES and PMULL, which
// golang.org/x/sys/cpu does not read there. Set at initialisation, never
// changed.
var keyedHardware = (runtime.GOARCH == "amd64" && cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSSE3 && cpu.X86.HasSSE41) ||
	(runtime.GOARCH == "arm64" && (cpu.ARM64.HasAES && cpu.ARM64.HasPMULL || runtime.GOOS == "darwin" || runtime.GOOS == "ios"))

// fpKey is the key of a Transport's keyed fingerprints, derived from its
// journal's secret; the zero fpKey (ok false) makes and checks none.
type fpKey struct {
	aes [16]byte
	id  [4]byte // in every fingerprint made with it
	ok  bool
	// scratch holds *keyedHash made for this key, each with its own
	// AES-GCM (whose set-up costs more than a small body's tags): an AEAD
	// is not documented as safe for concurrent use, so none is shared.
	scratch *sync.Pool
}

// fingerprintKey derives j's fpKey: none when j keeps no secret, or when
// the runtime refuses AES-GCM (GODEBUG=fips140=only).
func fingerprintKey(j journal.Journal) fpKey {
	k, keeper := j.(journal.FingerprintKeeper)
	if !keeper {
		return fpKey{}
	}
	secret, ok := k.FingerprintSecret(j)
	if !ok {
		return fpKey{}
	}
	mac := hmac.New(sha256.New, secret[:])
	mac.Write([]byte("idemretry keyed fingerprint 1"))
	var key fpKey
	sum := mac.Sum(nil)
	copy(key.aes[:], sum[:16])
	copy(key.id[:], sum[16:20])
	if _, err := key.aead(); err != nil {
		return fpKey{}
	}
	key.ok = true
	key.scratch = &sync.Pool{}
	return key
}

func (k *fpKey) aead() (cipher.AEAD, error) {
	block, err := aes.NewCipher(k.aes[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// isKeyed reports whether fp has the keyed form.
func isKeyed(fp journal.Fingerprint) bool { return [4]byte(fp[:4]) == keyedMagic }

// newFingerprint returns the fingerprint of req for a new record of its
// action: keyed when keyable (a named action's first hop), its body known
// to be keyedMinBody bytes or more, and key and the hardware make that the
// faster; plain otherwise.
func newFingerprint(req *http.Request, b *body, keyable bool, key *fpKey) (journal.Fingerprint, error) {
	if !keyable || !key.ok || !keyedHardware || b.size(req) < keyedMinBody {
		return fingerprint(req, b)
	}
	return keyedFingerprint(req, b, newKeyedHead(key), key)
}

// newKeyedHead returns the first 16 bytes of a new keyed fingerprint under
// key: the magic, the key's id and a salt drawn for it. The salt begins
// every chunk's nonce. GCM's rule that a nonce never repeat under one key
// guards tags that are seen; no tag leaves keyedFingerprint (only the
// SHA-256 of them, inside another SHA-256, cut to 16 bytes), and
// matchFingerprint itself reuses a record's salt for every request checked
// against it, another body included. What the salt buys is that two
// records of one payload differ (a reader of the journal cannot tell they
// are one payload); a repeat would cost that, not the MAC. So it need be
// neither secret nor unpredictable: math/rand/v2's generator (ChaCha8,
// seeded from the system's randomness in every process) draws it in a few
// nanoseconds, where crypto/rand's system call took as long as a small
// body's tags.
func newKeyedHead(key *fpKey) (head journal.Fingerprint) {
	copy(head[:4], keyedMagic[:])
	copy(head[4:8], key.id[:])
	binary.LittleEndian.PutUint64(head[8:16], rand.Uint64())
	return head
}

// matchFingerprint computes req's fingerprint in want's form (with want's
// salt when keyed) and reports whether it is want. A keyed want that key
// cannot check (the journal keeps no secret here, or AES-GCM is refused) is
// ErrFingerprintUncheckable, unless req's plain fingerprint is want.
func matchFingerprint(req *http.Request, b *body, want journal.Fingerprint, key *fpKey) (journal.Fingerprint, bool, error) {
	uncheckable := false
	if isKeyed(want) {
		fp, err := keyedFingerprint(req, b, want, key)
		switch {
		case errors.Is(err, ErrFingerprintUncheckable):
			uncheckable = true
		case err != nil || fp == want:
			return fp, err == nil, err
		}
		// A plain fingerprint that begins with keyedMagic is checked below.
	}
	fp, err := fingerprint(req, b)
	if err != nil {
		return journal.Fingerprint{}, false, err
	}
	if fp != want && uncheckable {
		return journal.Fingerprint{}, false, ErrFingerprintUncheckable
	}
	return fp, fp == want, nil
}

// keyedFingerprint returns req's keyed fingerprint with head's magic, key
// id and salt, under key, which must be the key of that id.
func keyedFingerprint(req *http.Request, b *body, head journal.Fingerprint, key *fpKey) (journal.Fingerprint, error) {
	if !key.ok || [4]byte(head[4:8]) != key.id {
		return journal.Fingerprint{}, ErrFingerprintUncheckable
	}
	k, _ := key.scratch.Get().(*keyedHash)
	if k == nil {
		aead, err := key.aead()
		if err != nil {
			return journal.Fingerprint{}, fmt.Errorf("%w: %w", ErrFingerprintUncheckable, err)
		}
		k = &keyedHash{aead: aead, tags: sha256.New(), tag: make([]byte, 0, 16), buf: make([]byte, 0, 256)}
	}
	defer key.scratch.Put(k)
	k.reset(head[8:16])
	if err := b.hashInto(k); err != nil {
		return journal.Fingerprint{}, fmt.Errorf("idemretry: request body: %w", err)
	}
	k.end()
	buf := append(k.buf[:0], head[:16]...)
	buf = append(buf, req.Method...)
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
	aead  cipher.AEAD // under the key of the pool (fpKey.scratch) it is in
	tags  hash.Hash   // SHA-256 of the chunks' tags, in order
	chunk []byte      // a chunk being filled, grown up to keyedChunk
	n     uint32      // chunks authenticated
	size  uint64      // bytes written
	nonce [12]byte    // the salt, and n
	tag   []byte
	buf   []byte
}

func (k *keyedHash) reset(noncePrefix []byte) {
	k.n, k.size = 0, 0
	copy(k.nonce[:8], noncePrefix)
	k.tags.Reset()
	k.chunk = k.chunk[:0]
}

func (k *keyedHash) Write(p []byte) (int, error) {
	n := len(p)
	k.size += uint64(n)
	if len(k.chunk) > 0 {
		m := min(keyedChunk-len(k.chunk), len(p))
		k.chunk, p = append(k.chunk, p[:m]...), p[m:]
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
	// Grown as needed, never past keyedChunk: a small body's scratch (a
	// new one on every pool miss) holds its bytes, not a whole chunk.
	k.chunk = append(k.chunk, p...)
	return n, nil
}

// end authenticates the last, partial chunk.
func (k *keyedHash) end() {
	if len(k.chunk) > 0 {
		k.seal(k.chunk)
		k.chunk = k.chunk[:0]
	}
}

func (k *keyedHash) seal(c []byte) {
	binary.BigEndian.PutUint32(k.nonce[8:], k.n)
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
		return journal.Fingerprint{}, fmt.Errorf("idemretry: request body: %w", err)
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
