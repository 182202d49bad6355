package idemretry

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
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

// keyedReference is the keyed form's definition, written out plainly: it
// pins what journals hold (a record keeps its fingerprint for its key
// window and past a restart, so the definition must not drift).
func keyedReference(t *testing.T, head journal.Fingerprint, method, url string, body []byte) journal.Fingerprint {
	t.Helper()
	block, err := aes.NewCipher(head[:16])
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	tags := sha256.New()
	for i := 0; i*keyedChunk < len(body); i++ {
		var nonce [12]byte
		binary.BigEndian.PutUint64(nonce[4:], uint64(i))
		tags.Write(aead.Seal(nil, nonce[:], nil, body[i*keyedChunk:min(len(body), (i+1)*keyedChunk)]))
	}
	var length [8]byte
	binary.BigEndian.PutUint64(length[:], uint64(len(body)))
	sum := sha256.Sum256([]byte(method + "\x00" + url + "\x00" + string(length[:]) + string(tags.Sum(nil))))
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
	if !keyedHardware {
		t.Skip("no AES-GCM instructions: new fingerprints are plain here")
	}
	for _, n := range []int{keyedMinBody, keyedChunk + 1, 2*keyedChunk - 1, 3 * keyedChunk, 5*keyedChunk + 777} {
		p := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz"), n/36+1)[:n]
		req, b := keyedRequest(t, p, false, 0)
		fp, err := newFingerprint(req, b, true)
		require.NoError(t, err)
		require.True(t, isKeyed(fp), "size %d", n)
		require.Equal(t, keyedReference(t, fp, http.MethodPost, req.URL.String(), p), fp, "size %d", n)
		again, err := newFingerprint(req, b, true)
		require.NoError(t, err)
		assert.NotEqual(t, fp[4:16], again[4:16], "each new fingerprint draws its own secret")
		for seed := range uint64(5) {
			r2, b2 := keyedRequest(t, p, true, seed)
			got, same, err := matchFingerprint(r2, b2, fp)
			require.NoError(t, err)
			require.True(t, same, "size %d, split with seed %d", n, seed)
			require.Equal(t, fp, got)
			q := bytes.Clone(p)
			q[rand.New(rand.NewPCG(seed, 2)).IntN(n)] ^= 1
			r3, b3 := keyedRequest(t, q, seed%2 == 0, seed)
			_, same, err = matchFingerprint(r3, b3, fp)
			require.NoError(t, err)
			require.False(t, same, "size %d: one bit flipped matched", n)
		}
	}
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
		fp, err := newFingerprint(req, &b, c.keyable)
		require.NoError(t, err, c.name)
		require.Equal(t, plain(req, c.p), fp, c.name)
		_, same, err := matchFingerprint(req, &b, fp)
		require.NoError(t, err)
		require.True(t, same, c.name)
	}
}
