package idemretry

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"

	"github.com/google/uuid"
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

// A replaced crypto/rand.Reader that returns short reads still gives full,
// canonical, distinct v4 keys; one that runs dry gives an error, no panic.
func TestRevFinalReplacedReaderShortReads(t *testing.T) {
	orig := rand.Reader
	defer func() { rand.Reader = orig }()
	rand.Reader = byteAtATime{orig}
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
	if _, err := newUUIDKey(); err == nil {
		t.Fatal("an empty Reader gave a key")
	}
}

// The hand-set bits equal uuid's for every byte value.
func TestRevFinalUUIDBitsMatchLibrary(t *testing.T) {
	for b := 0; b < 256; b++ {
		var u uuid.UUID
		for i := range u {
			u[i] = byte(b)
		}
		u[6] = u[6]&0x0f | 0x40
		u[8] = u[8]&0x3f | 0x80
		lib, _ := uuid.NewRandomFromReader(fixedReader(b))
		if u != lib {
			t.Fatalf("byte %#x: %s != %s", b, u, lib)
		}
	}
}
