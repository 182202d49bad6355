package idemretry

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Fingerprinting reads an in-memory body in place (body.writeTo) instead of
// a copy from GetBody: the fingerprint must be the one of the bytes the
// first attempt sends, as the copy gave it, for every body http.NewRequest
// knows (at any size, across the read chunk, and for a reader already
// partly read before NewRequest), for a body read into memory, and for one
// it does not know (which still goes through GetBody); and reading it must
// leave what the first attempt sends untouched.
func TestFingerprintInPlaceIsTheCopysFingerprint(t *testing.T) {
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
				first, err := b.next()
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
