package idemretry

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemretry/idemretry/journal"
)

// Internals of action.go: the UUIDv4 keys newUUIDKey makes from
// crypto/rand.Reader (a replaced one too), and WithAction's context.

// newUUIDKey's keys are canonical random (version 4, RFC 9562 variant)
// UUIDs, as uuid.NewRandom makes them, and no two alike.
func TestNewUUIDKeyIsCanonicalV4(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		k, err := newUUIDKey()
		if err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(k)
		if err != nil {
			t.Fatalf("%q: %v", k, err)
		}
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != k {
			t.Fatalf("%q: version %d, variant %v, canonical %q", k, u.Version(), u.Variant(), u.String())
		}
		if seen[k] {
			t.Fatalf("%q made twice", k)
		}
		seen[k] = true
	}
}

// WithAction's context is a context value: the innermost id wins, other
// values and cancellation come from the parent, and contexts derived from
// it register with the parent's cancellation instead of starting a
// goroutine each.
func TestWithActionIsAContextValue(t *testing.T) {
	type otherKey struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), otherKey{}, "v"))
	defer cancel()
	ctx := WithAction(parent, "pay:1")
	inner := context.WithValue(WithAction(ctx, "pay:2"), otherKey{}, "w")
	if id, ok := ActionFromContext(ctx); !ok || id != "pay:1" {
		t.Errorf("ActionFromContext = %q, %v; want pay:1", id, ok)
	}
	if id, ok := ActionFromContext(inner); !ok || id != "pay:2" {
		t.Errorf("nested: ActionFromContext = %q, %v; want pay:2", id, ok)
	}
	if v := ctx.Value(otherKey{}); v != "v" {
		t.Errorf("the parent's value: %v", v)
	}
	if _, ok := ActionFromContext(WithAction(ctx, "")); ok {
		t.Error("an empty id is reported as set")
	}
	if _, ok := ActionFromContext(parent); ok {
		t.Error("an id is reported where none was set")
	}
	if s := fmt.Sprint(ctx); !strings.Contains(s, "pay:1") {
		t.Errorf("String = %s", s)
	}
	before := runtime.NumGoroutine()
	var derived []context.Context
	for range 100 {
		d, c := context.WithCancel(inner)
		defer c()
		derived = append(derived, d)
	}
	if n := runtime.NumGoroutine(); n >= before+50 {
		t.Errorf("%d goroutines after deriving 100 contexts, %d before: derived contexts do not find the parent's cancellation", n, before)
	}
	cancel()
	for _, d := range derived {
		select {
		case <-d.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a derived context was not cancelled with the parent")
		}
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("Err = %v", ctx.Err())
	}
}

// Printing a WithAction context names the id, and a parent without a
// String method by its type, never by its fields (which may hold
// secrets, and may be written meanwhile); a nil parent gives a context that
// http.NewRequestWithContext refuses, not one that fails deep in a send.
func TestWithActionStringAndNilParent(t *testing.T) {
	t.Parallel()
	type appCtx struct {
		context.Context
		apiToken string
	}
	parent := &appCtx{Context: context.Background(), apiToken: "sk_live_secret"}
	s := fmt.Sprint(WithAction(parent, "pay:1"))
	if strings.Contains(s, "sk_live_secret") || !strings.Contains(s, "pay:1") {
		t.Errorf("String = %s", s)
	}
	//lint:ignore SA1012 a nil parent is the point
	ctx := WithAction(nil, "pay:1")
	if _, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:1/", nil); err == nil {
		t.Error("WithAction(nil, id) made a context that http.NewRequestWithContext accepts")
	}
}

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
