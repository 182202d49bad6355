package idemretry

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// Internals of fingerprint.go: the keyed and plain forms held to their
// definitions, the URL as URL.String writes it, hashing in place, and the
// pooled scratch.

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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// appendURL writes the bytes of URL.String, which the fingerprint hashes:
// one byte of difference would give a stored action another fingerprint.
func TestAppendURLIsURLString(t *testing.T) {
	t.Parallel()
	for _, s := range appendURLSeeds {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if got, want := string(appendURL([]byte("x"), u)), "x"+u.String(); got != want {
			t.Errorf("%q: appendURL %q, String %q", s, got, want)
		}
	}
	// Hand-made URLs, which Parse would not give.
	for _, u := range []*url.URL{
		{Scheme: "http", Host: "h", Path: "a/b"},
		{Scheme: "http", Host: "h", Path: "/a b", ForceQuery: true},
		{Scheme: "http", Host: "h", Path: "/p", RawQuery: "a=1&b=%20", Fragment: "f"},
		{Scheme: "https", Host: "h", Path: "/p", OmitHost: true},
		{Scheme: "http", Host: "h", Path: "*"},
		{Scheme: "http", Host: "h", Path: "/ü"},
		{Scheme: "http", Host: "h", Path: "/a%2Fb", RawPath: "/a%2Fb"},
		{Scheme: "http", Host: "[::1]:80", Path: "/"},
		{Scheme: "http", Host: "h", Path: "/", User: url.UserPassword("u", "p")},
	} {
		if got, want := string(appendURL(nil, u)), u.String(); got != want {
			t.Errorf("%#v: appendURL %q, String %q", u, got, want)
		}
	}
}

var appendURLSeeds = []string{
	"http://stub.invalid/charges", "https://api.example.com/v1/payments?expand=charge",
	"http://127.0.0.1:8080/", "http://[::1]:80/x", "http://h", "http://h?", "http://h/?a=b#frag",
	"http://h/a%20b", "http://h/a%2Fb", "http://user:pw@h/p", "mailto:x@y", "/relative/path",
	"http://h/~user/a-b_c.d", "http://h/a:b@c;d=e", "HTTP://H/P", "http://h/*", "http://h/%7E",
	"http://xn--nxasmq6b.example/p", "http://h/p?q=%ZZ", "http://h:/p", "//h/p",
}

func FuzzAppendURL(f *testing.F) {
	for _, s := range appendURLSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		if got, want := string(appendURL(nil, u)), u.String(); got != want {
			t.Fatalf("%q: appendURL %q, String %q", s, got, want)
		}
	})
}

// Fingerprinting reads an in-memory body in place (body.writeTo) instead of
// a copy from GetBody: the fingerprint must be the one of the bytes the
// first attempt sends, as the copy gave it, for every body http.NewRequest
// knows (at any size, across the read chunk, and for a reader already
// partly read before NewRequest), for a body read into memory, and for one
// it does not know (which still goes through GetBody); and reading it must
// leave what the first attempt sends untouched.
func TestFingerprintInPlaceIsTheCopysFingerprint(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 1, 1024, 2048, 2049, 5000, 70000} {
		payload := bytes.Repeat([]byte("0123456789abcdefghij"), size/20+1)[:size]
		for _, skip := range []int{0, 1, size / 2} {
			if skip > size {
				continue
			}
			makers := map[string]func() io.Reader{
				"bytes.Reader": func() io.Reader {
					r := bytes.NewReader(payload)
					r.Seek(int64(skip), io.SeekStart)
					return r
				},
				"strings.Reader": func() io.Reader {
					r := strings.NewReader(string(payload))
					r.Seek(int64(skip), io.SeekStart)
					return r
				},
				"bytes.Buffer": func() io.Reader {
					b := bytes.NewBuffer(append([]byte(nil), payload...))
					b.Next(skip)
					return b
				},
				"unknown": func() io.Reader { // buffered into memory by newBody
					return io.MultiReader(bytes.NewReader(payload[skip:]))
				},
			}
			for name, mk := range makers {
				req, err := http.NewRequest(http.MethodPost, "http://example.test/pay", mk())
				if err != nil {
					t.Fatal(err)
				}
				want := sha256.Sum256(payload[skip:])
				// The fingerprint as it was computed before: the SHA-256 of
				// a GetBody copy.
				var viaCopy [32]byte
				if req.GetBody != nil {
					c, _ := req.GetBody()
					if c == http.NoBody || c == nil {
						viaCopy = sha256.Sum256(nil)
					} else {
						all, _ := io.ReadAll(c)
						viaCopy = sha256.Sum256(all)
					}
				} else {
					viaCopy = want
				}
				if viaCopy != want {
					t.Fatalf("%s size %d skip %d: the GetBody copy is not the unread body", name, size, skip)
				}
				b, err := newBody(req, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				fp, err := fingerprint(req, &b)
				if err != nil {
					t.Fatal(err)
				}
				var ref body
				if size-skip > 0 {
					ref = body{getBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(payload[skip:])), nil }}
				}
				wantFP, err := fingerprint(req, &ref) // through GetBody: the custom closure is not an in-memory reader
				if err != nil {
					t.Fatal(err)
				}
				if fp != wantFP {
					t.Errorf("%s size %d skip %d: fingerprint in place %x, through a copy %x", name, size, skip, fp, wantFP)
				}
				first, _, err := b.next()
				if err != nil {
					t.Fatal(err)
				}
				sent, _ := io.ReadAll(first)
				if !bytes.Equal(sent, payload[skip:]) {
					t.Errorf("%s size %d skip %d: the first attempt sends %d bytes, want %d", name, size, skip, len(sent), size-skip)
				}
				b.close()
			}
		}
	}
}

// A body whose GetBody the Transport does not know is fingerprinted from
// its GetBody copy, as before: a NopCloser around a reader that is not one
// of http.NewRequest's.
func TestFingerprintOtherBodyUsesGetBody(t *testing.T) {
	t.Parallel()
	payload := []byte(`{"amount":1}`)
	req, err := http.NewRequest(http.MethodPost, "http://example.test/pay", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Body = io.NopCloser(io.LimitReader(strings.NewReader("not what GetBody gives"), 100))
	calls := 0
	req.GetBody = func() (io.ReadCloser, error) {
		calls++
		return io.NopCloser(bytes.NewReader(payload)), nil
	}
	b, err := newBody(req, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	fp, err := fingerprint(req, &b)
	if err != nil {
		t.Fatal(err)
	}
	ref := body{getBody: req.GetBody}
	want, _ := fingerprint(req, &ref)
	if calls != 2 || fp != want {
		t.Errorf("GetBody called %d times (want 2), fingerprint %x want %x", calls, fp, want)
	}
}

// The URL in a fingerprint is URL.String's, whichever way appendURL takes:
// every byte value in a host and a path, one at a time.
func TestAppendURLIsURLStringForEveryByte(t *testing.T) {
	t.Parallel()
	for c := 0; c < 256; c++ {
		for _, u := range []*url.URL{
			{Scheme: "https", Host: "pay.example" + string(rune(c)) + ":8443", Path: "/v1/charges"},
			{Scheme: "https", Host: "pay.example", Path: "/v1/" + string([]byte{byte(c)}) + "/charges", RawQuery: "a=b"},
			{Scheme: "http", Host: "[::1]:80", Path: "/x" + string([]byte{byte(c)})},
		} {
			if got, want := string(appendURL(nil, u)), u.String(); got != want {
				t.Fatalf("byte %#x: appendURL = %q, URL.String = %q", c, got, want)
			}
		}
	}
}

// hS1's review of the keyed fingerprint for bodies of keyedMinBody bytes
// or more (commit 175a114): the per-key pool of scratch (fpKey.scratch).

// The pooled scratch keeps nothing of one fingerprint into the next: a
// scratch used for a body cut short by its reader's error (a partial chunk
// left in it), for a body of several chunks, or for one of another size,
// then used again, gives the definition (keyedReference), in any order of
// sizes, from many goroutines, under two keys at once whose pools must
// never lend each other a scratch.
//
// Found in review hs1 (ebb7e06; was TestReviewHS1PooledScratchKeepsNothing).
func TestKeyedPooledScratchKeepsNothing(t *testing.T) {
	t.Parallel()
	key, secret := testKey(t)
	needKeyed(t, &key)
	var other [32]byte
	for i := range other {
		other[i] = byte(0xa0 + i)
	}
	key2 := fingerprintKey(keeper{journal.NewMemory(), other})
	require.True(t, key2.ok)
	require.NotEqual(t, key.id, key2.id)
	sizes := []int{keyedMinBody - 1, keyedMinBody, keyedMinBody + 1, 1000, keyedChunk - 1, keyedChunk, keyedChunk + 1, 2*keyedChunk + 3}
	type result struct {
		fp     journal.Fingerprint
		secret [32]byte
		body   []byte
		what   string
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		made []result
	)
	errs := make(chan error, 64)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, s := &key, secret
			if g%2 == 1 {
				k, s = &key2, other
			}
			for i := range 40 {
				n := sizes[(g+i*3)%len(sizes)]
				p := bytes.Repeat([]byte{byte('a' + (g+i)%26)}, n)
				p[n/2] ^= byte(i)
				if i%5 == 0 {
					// A body that fails part way: its partial chunk stays
					// in the scratch, which goes back to the pool.
					req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", nil)
					if err != nil {
						errs <- err
						return
					}
					req.GetBody = func() (io.ReadCloser, error) {
						return io.NopCloser(io.MultiReader(bytes.NewReader(p[:n/2+1]), failing{})), nil
					}
					req.ContentLength = int64(n)
					req.Body, _ = req.GetBody()
					b, err := newBody(req, 1<<30)
					if err != nil {
						errs <- err
						return
					}
					if _, err := keyedFingerprint(req, &b, newKeyedHead(k), k); err == nil {
						errs <- errors.New("a failing body gave a fingerprint")
						return
					}
				}
				req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges?x=1", bytes.NewReader(p))
				if err != nil {
					errs <- err
					return
				}
				if i%2 == 0 {
					req.GetBody = func() (io.ReadCloser, error) {
						return io.NopCloser(&splitReader{b: p, rnd: rand.New(rand.NewPCG(uint64(g), uint64(i)))}), nil
					}
				}
				b, err := newBody(req, 1<<30)
				if err != nil {
					errs <- err
					return
				}
				fp, err := keyedFingerprint(req, &b, newKeyedHead(k), k)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				made = append(made, result{fp: fp, secret: s, body: p, what: fmt.Sprintf("goroutine %d, body %d of %d bytes", g, i, n)})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Len(t, made, 16*40)
	for _, r := range made {
		require.Equal(t, keyedReference(t, r.secret, r.fp, http.MethodPost, "https://pay.example/v1/charges?x=1", r.body), r.fp, r.what)
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("hs1: the body's reader failed") }

// An in-memory copy's check reads its unread bytes in place: its sum is
// the hash of those bytes, as a streamed copy's check computes it, and the
// reader is left where it was, for net/http to send.
func TestInMemorySumLeavesTheReaderAsItWas(t *testing.T) {
	t.Parallel()
	const payload = `{"amount":100}`
	want := maphash.String(bodySeed, payload[3:])
	for name, r := range map[string]io.Reader{
		"bytes.Reader":              bytes.NewReader([]byte(payload)),
		"strings.Reader":            strings.NewReader(payload),
		"bytes.Buffer":              bytes.NewBufferString(payload),
		"NopCloser(strings.Reader)": io.NopCloser(strings.NewReader(payload)),
	} {
		var skip [3]byte
		if _, err := io.ReadFull(r, skip[:]); err != nil {
			t.Fatal(err)
		}
		sum, ok := inMemorySum(r)
		if !ok || sum != want {
			t.Errorf("%s: inMemorySum = %x, %v; want %x, true", name, sum, ok, want)
		}
		rest, _ := io.ReadAll(r)
		if string(rest) != payload[3:] {
			t.Errorf("%s: after the check it gives %q, want %q", name, rest, payload[3:])
		}
	}
	if _, ok := inMemorySum(struct{ io.Reader }{strings.NewReader(payload)}); ok {
		t.Error("a reader net/http does not know to be in memory was checked in place")
	}
}
