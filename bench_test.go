package idemretry

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/idemretry/idemretry/journal"
)

// Benchmarks of the request path's parts: a fingerprint, a key.

// BenchmarkFingerprint times a new fingerprint of a POST body of each size,
// from GetBody as an http.NewRequest body gives it, in the plain form
// (SHA-256) and in the keyed form (AES-GCM tags), to place keyedMinBody
// where the keyed form is the cheaper.
func BenchmarkFingerprint(b *testing.B) {
	key := fingerprintKey(journal.NewMemory())
	if !key.ok || !keyedHardware {
		b.Skip("no keyed fingerprints here")
	}
	for _, size := range []int{0, 64, 128, 192, 256, 512, 1 << 10, 4 << 10, 16 << 10, 64 << 10} {
		p := bytes.Repeat([]byte("x"), size)
		for _, form := range []string{"plain", "keyed"} {
			b.Run(fmt.Sprintf("%s/%d", form, size), func(b *testing.B) {
				req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", bytes.NewReader(p))
				if err != nil {
					b.Fatal(err)
				}
				bd, err := newBody(req, 1<<30)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if form == "plain" {
						_, err = fingerprint(req, &bd)
					} else {
						_, err = keyedFingerprint(req, &bd, newKeyedHead(&key), &key)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
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
