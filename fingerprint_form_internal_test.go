package idemretry

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// keeper is a journal that keeps a secret it is given.
type keeper struct {
	journal.Journal
	secret [32]byte
}

func (k keeper) FingerprintSecret(journal.Journal) ([32]byte, bool) { return k.secret, true }

// testKey is the fpKey of a journal whose secret is 0x01 0x02 ... 0x20.
func testKey(t *testing.T) (fpKey, [32]byte) {
	t.Helper()
	var secret [32]byte
	for i := range secret {
		secret[i] = byte(i + 1)
	}
	key := fingerprintKey(keeper{journal.NewMemory(), secret})
	return key, secret
}

// needKeyed skips a test of keyed fingerprints where none can be made or
// checked: AES-GCM refused (GODEBUG=fips140=only). Where AES-GCM merely
// runs in software (no AES instructions, keyedHardware false) keyed
// fingerprints are still checked, so the tests run.
func needKeyed(t *testing.T, key *fpKey) {
	t.Helper()
	if key.ok {
		return
	}
	block, err := aes.NewCipher(make([]byte, 16))
	require.NoError(t, err)
	_, err = cipher.NewGCM(block)
	require.Error(t, err, "AES-GCM is allowed here, yet the journal's secret gave no key")
	t.Skipf("AES-GCM refused here (%v): no keyed fingerprint is made or checked", err)
}

// newKeyed returns a new keyed fingerprint of req under key: from
// newFingerprint where the keyed form is the new one (keyedHardware);
// elsewhere newFingerprint must give the plain form, and the keyed one is
// made as a machine with AES instructions would (same head layout).
func newKeyed(t *testing.T, req *http.Request, b *body, key *fpKey) journal.Fingerprint {
	t.Helper()
	fp, err := newFingerprint(req, b, true, key)
	require.NoError(t, err)
	if keyedHardware {
		require.True(t, isKeyed(fp), "a named large body's new fingerprint is keyed")
		return fp
	}
	plain, err := fingerprint(req, b)
	require.NoError(t, err)
	require.Equal(t, plain, fp, "without AES instructions a new fingerprint is plain")
	var head journal.Fingerprint
	copy(head[:4], keyedMagic[:])
	copy(head[4:8], key.id[:])
	_, err = crand.Read(head[8:16])
	require.NoError(t, err)
	fp, err = keyedFingerprint(req, b, head, key)
	require.NoError(t, err)
	return fp
}

// keyedReference is the keyed form's definition, written out plainly: it
// pins what journals hold (a record keeps its fingerprint for its key
// window and past a restart, and every process sharing the journal must
// compute the same, so the definition must not drift).
func keyedReference(t *testing.T, secret [32]byte, head journal.Fingerprint, method, url string, body []byte) journal.Fingerprint {
	t.Helper()
	mac := hmac.New(sha256.New, secret[:])
	mac.Write([]byte("idemretry keyed fingerprint 1"))
	derived := mac.Sum(nil)
	require.Equal(t, derived[16:20], head[4:8], "the key's id")
	block, err := aes.NewCipher(derived[:16])
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	tags := sha256.New()
	for i := 0; i*keyedChunk < len(body); i++ {
		var nonce [12]byte
		copy(nonce[:8], head[8:16])
		binary.BigEndian.PutUint32(nonce[8:], uint32(i))
		tags.Write(aead.Seal(nil, nonce[:], nil, body[i*keyedChunk:min(len(body), (i+1)*keyedChunk)]))
	}
	var length [8]byte
	binary.BigEndian.PutUint64(length[:], uint64(len(body)))
	sum := sha256.Sum256([]byte(string(head[:16]) + method + "\x00" + url + "\x00" + string(length[:]) + string(tags.Sum(nil))))
	fp := head
	copy(fp[16:], sum[:16])
	return fp
}

// splitReader gives its bytes in reads of random sizes, without WriterTo:
// a GetBody that is not an in-memory reader.
type splitReader struct {
	b   []byte
	rnd *rand.Rand
}

func (s *splitReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(s.b), 1+s.rnd.IntN(3*keyedChunk/2))
	copy(p, s.b[:n])
	s.b = s.b[n:]
	return n, nil
}

func keyedRequest(t *testing.T, p []byte, split bool, seed uint64) (*http.Request, *body) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges?x=1", bytes.NewReader(p))
	require.NoError(t, err)
	if split {
		req.GetBody = func() (io.ReadCloser, error) {
			return io.NopCloser(&splitReader{b: p, rnd: rand.New(rand.NewPCG(seed, 1))}), nil
		}
	}
	b, err := newBody(req, 1<<30)
	require.NoError(t, err)
	return req, &b
}

// The keyed form is its definition, whatever sizes the body's reader
// gives its bytes in, at and around the chunk boundaries; and checked
// against a request, in place or split, it matches the same bytes only.
func TestKeyedFingerprintDefinition(t *testing.T) {
	key, secret := testKey(t)
	needKeyed(t, &key)
	for _, n := range []int{keyedMinBody, keyedChunk + 1, 2*keyedChunk - 1, 3 * keyedChunk, 5*keyedChunk + 777} {
		p := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz"), n/36+1)[:n]
		req, b := keyedRequest(t, p, false, 0)
		fp := newKeyed(t, req, b, &key)
		require.True(t, isKeyed(fp), "size %d", n)
		require.Equal(t, keyedReference(t, secret, fp, http.MethodPost, req.URL.String(), p), fp, "size %d", n)
		again := newKeyed(t, req, b, &key)
		assert.NotEqual(t, fp[8:16], again[8:16], "each new fingerprint draws its own salt")
		// A body without GetBody, which newBody reads into memory and the
		// fingerprint reads in place: the same definition.
		rb, err := http.NewRequest(http.MethodPost, req.URL.String(), io.NopCloser(bytes.NewReader(p)))
		require.NoError(t, err)
		bb, err := newBody(rb, 1<<30)
		require.NoError(t, err)
		require.NotNil(t, bb.buf, "read into memory")
		inPlace := newKeyed(t, rb, &bb, &key)
		require.Equal(t, keyedReference(t, secret, inPlace, http.MethodPost, req.URL.String(), p), inPlace, "size %d, in memory", n)
		_, same, err := matchFingerprint(req, b, inPlace, &key)
		require.NoError(t, err)
		require.True(t, same, "size %d: the GetBody copy against the in-memory one", n)
		for seed := range uint64(5) {
			r2, b2 := keyedRequest(t, p, true, seed)
			got, same, err := matchFingerprint(r2, b2, fp, &key)
			require.NoError(t, err)
			require.True(t, same, "size %d, split with seed %d", n, seed)
			require.Equal(t, fp, got)
			q := bytes.Clone(p)
			q[rand.New(rand.NewPCG(seed, 2)).IntN(n)] ^= 1
			r3, b3 := keyedRequest(t, q, seed%2 == 0, seed)
			_, same, err = matchFingerprint(r3, b3, fp, &key)
			require.NoError(t, err)
			require.False(t, same, "size %d: one bit flipped matched", n)
		}
	}
}

// A record's keyed fingerprint does not hold its key: GHASH is collided at
// will by whoever knows its key H (AES_K(0)), by adding 1 to one block of
// a chunk and H to the next (the two terms cancel). A forger who reads the
// record and takes its first 16 bytes for the key, as a key kept in the
// record would have let them, does not get a body that passes; one who has
// the journal's secret does, which is why the secret stays in the journal.
func TestKeyedFingerprintIsNotForgedFromTheRecord(t *testing.T) {
	key, _ := testKey(t)
	needKeyed(t, &key)
	p := bytes.Repeat([]byte(`{"amount":1000,"iban":"DE00000000000000000000"}`+"\n"), 3*keyedChunk/48)
	req, b := keyedRequest(t, p, false, 0)
	fp := newKeyed(t, req, b, &key)
	forge := func(aesKey []byte) []byte {
		block, err := aes.NewCipher(aesKey)
		require.NoError(t, err)
		var h [16]byte
		block.Encrypt(h[:], h[:])
		q := bytes.Clone(p)
		at := keyedChunk + 16*7 // two blocks inside the second chunk
		q[at+15] ^= 1           // GHASH's field element 1 is 0x80 in the first byte; either way, add x and then x*H
		var one [16]byte
		one[15] = 1
		// Adding d to block i and d*H to block i+1 leaves GHASH unchanged
		// (d*H^(k) + d*H*H^(k-1)); d*H is computed in GHASH's field.
		dh := ghashMul(one, h)
		for i := range dh {
			q[at+16+i] ^= dh[i]
		}
		return q
	}
	fromRecord := forge(fp[:16])
	r1, b1 := keyedRequest(t, fromRecord, false, 0)
	_, same, err := matchFingerprint(r1, b1, fp, &key)
	require.NoError(t, err)
	assert.False(t, same, "a body forged from the record alone passed")
	withSecret := forge(key.aes[:])
	r2, b2 := keyedRequest(t, withSecret, false, 0)
	_, same, err = matchFingerprint(r2, b2, fp, &key)
	require.NoError(t, err)
	assert.True(t, same, "the forgery with the journal's key did not pass: the test forges nothing")
}

// ghashMul multiplies x and y in GHASH's field (NIST SP 800-38D, 6.3).
func ghashMul(x, y [16]byte) [16]byte {
	var z [16]byte
	v := y
	for i := 0; i < 128; i++ {
		if x[i/8]>>(7-i%8)&1 == 1 {
			for j := range z {
				z[j] ^= v[j]
			}
		}
		lsb := v[15] & 1
		for j := 15; j > 0; j-- {
			v[j] = v[j]>>1 | v[j-1]<<7
		}
		v[0] >>= 1
		if lsb == 1 {
			v[0] ^= 0xe1
		}
	}
	return z
}

// Where a new fingerprint is plain: not keyable (unnamed, a redirect hop),
// a small body, a body of unknown length. Plain is the legacy definition,
// which matchFingerprint checks as before.
func TestPlainFingerprintWhereNotKeyed(t *testing.T) {
	large := []byte(strings.Repeat("x", keyedMinBody))
	plain := func(req *http.Request, p []byte) journal.Fingerprint {
		sum := sha256.Sum256(p)
		return sha256.Sum256([]byte(req.Method + "\x00" + req.URL.String() + "\x00" + string(sum[:])))
	}
	for _, c := range []struct {
		name    string
		p       []byte
		keyable bool
		length  int64
	}{
		{"unnamed", large, false, int64(len(large))},
		{"small", large[:keyedMinBody-1], true, keyedMinBody - 1},
		{"unknown length", large, true, -1},
	} {
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", bytes.NewReader(c.p))
		require.NoError(t, err)
		req.ContentLength = c.length
		req.Body = io.NopCloser(req.Body) // a caller's Body: hashed from GetBody
		b, err := newBody(req, 1<<30)
		require.NoError(t, err)
		key, _ := testKey(t)
		fp, err := newFingerprint(req, &b, c.keyable, &key)
		require.NoError(t, err, c.name)
		require.Equal(t, plain(req, c.p), fp, c.name)
		_, same, err := matchFingerprint(req, &b, fp, &key)
		require.NoError(t, err)
		require.True(t, same, c.name)
	}
}

// A keyed fingerprint made under another journal's secret (a record copied
// over, a fingerprint.key deleted and made anew) cannot be checked: that is
// ErrFingerprintUncheckable, never a match, and never taken for another
// payload. Nor can one be checked by a Transport whose journal keeps no
// secret.
func TestKeyedFingerprintUnderAnotherSecretIsUncheckable(t *testing.T) {
	key, _ := testKey(t)
	needKeyed(t, &key)
	p := bytes.Repeat([]byte("x"), keyedMinBody+1)
	req, b := keyedRequest(t, p, false, 0)
	fp := newKeyed(t, req, b, &key)
	require.True(t, isKeyed(fp))
	other := fingerprintKey(journal.NewMemory())
	require.True(t, other.ok)
	for name, k := range map[string]*fpKey{"another secret": &other, "no secret": {}} {
		_, same, err := matchFingerprint(req, b, fp, k)
		require.ErrorIs(t, err, ErrFingerprintUncheckable, name)
		require.False(t, same, name)
	}
}
