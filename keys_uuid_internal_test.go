package idemretry

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemretry/idemretry/journal"
)

// fixedReader yields b forever.
type fixedReader byte

func (f fixedReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(f)
	}
	return len(p), nil
}

// byteAtATime returns at most one byte per Read.
type byteAtATime struct{ r io.Reader }

func (b byteAtATime) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return b.r.Read(p)
}

// shortThenEOF returns 10 bytes, then io.EOF.
type shortThenEOF struct{ n int }

func (s *shortThenEOF) Read(p []byte) (int, error) {
	if s.n >= 10 {
		return 0, io.EOF
	}
	k := min(len(p), 10-s.n)
	s.n += k
	return k, nil
}

// errNoEntropy is what failingReader returns.
var errNoEntropy = errors.New("no entropy")

// failingReader always fails, as a Reader a program sets in crypto/rand's
// place may.
type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errNoEntropy }

// replaceRandReader sets crypto/rand.Reader to r until the test ends. The
// tests that call it must not run in parallel: the Reader is global.
func replaceRandReader(t *testing.T, r io.Reader) {
	orig := rand.Reader
	t.Cleanup(func() { rand.Reader = orig })
	rand.Reader = r
}

// A crypto/rand.Reader the program replaced is read when a key is made:
// the key's bits are its bytes (version and variant set); short reads
// still give full, canonical, distinct v4 keys; one that runs dry gives an
// error, no panic.
// (Before: keys_review_internal_test.go's TestRevFinalReplacedReaderShortReads.)
func TestNewUUIDKeyReadsReplacedReader(t *testing.T) {
	system := rand.Reader
	replaceRandReader(t, fixedReader(0xab))
	if k, err := newUUIDKey(); err != nil || k != "abababab-abab-4bab-abab-abababababab" {
		t.Fatalf("from a Reader of 0xab bytes: %q, %v", k, err)
	}
	rand.Reader = byteAtATime{system}
	seen := map[string]bool{}
	for range 2000 {
		k, err := newUUIDKey()
		if err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(k)
		if err != nil || u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != k || seen[k] {
			t.Fatalf("bad key %q (%v)", k, err)
		}
		seen[k] = true
	}
	rand.Reader = &shortThenEOF{}
	if _, err := newUUIDKey(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a Reader that runs dry: %v", err)
	}
	rand.Reader = bytes.NewReader(nil)
	if _, err := newUUIDKey(); !errors.Is(err, io.EOF) {
		t.Fatalf("an empty Reader: %v, want io.EOF", err)
	}
}

// A replaced crypto/rand.Reader that fails makes RoundTrip return its
// error, wrapped: nothing is sent, nothing is reserved in the journal, and
// the process goes on (crypto/rand.Read would end it on a Reader's error).
// (Before: internal/brokenrand's TestReplacedRandReaderBeforeInitIsAnError,
// which replaced the Reader before this package's init.)
func TestReplacedRandReaderErrorSendsNothing(t *testing.T) {
	var sent atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j := journal.NewMemory()
	tr, err := NewTransport(&http.Transport{}, WithJournal(j))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	replaceRandReader(t, failingReader{})
	ctx := WithAction(context.Background(), "pay:rand-order")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("RoundTrip minted a key from a failing Reader")
	}
	if !errors.Is(err, errNoEntropy) || !strings.HasPrefix(err.Error(), "idemretry: ") || strings.Count(err.Error(), "idemretry: ") != 1 {
		t.Fatalf("RoundTrip: %v, want the Reader's error, wrapped under the package prefix once", err)
	}
	if n := sent.Load(); n != 0 {
		t.Fatalf("the server received %d requests, want none", n)
	}
	if rec, ok, err := j.Get(context.Background(), "pay:rand-order"); ok || err != nil {
		t.Fatalf("the journal holds %+v (%v), want nothing", rec, err)
	}
}

// BenchmarkNewUUIDKey is the cost of one action's key, from crypto/rand's
// own Reader.
func BenchmarkNewUUIDKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := newUUIDKey(); err != nil {
			b.Fatal(err)
		}
	}
}
