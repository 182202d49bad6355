package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"

	"github.com/idemretry/idemretry/internal/procstat"
)

// Large bodies without the network: what idemretry adds per MiB of an
// 8 MiB POST with GetBody, over a base RoundTripper that reads the body
// into a buffer, as a connection would, and answers (stub), against plain
// net/http over the same stub; and what SHA-256, the hash of idemretry's
// plain request fingerprint (of an unnamed request, or a small body), costs
// per MiB. A named action's large body has the keyed fingerprint (AES-GCM
// tags under a key made from the journal's secret). The Large case measures the same
// POST over loopback, where the copy through the kernel dilutes the
// difference; here the difference is all there is. The fingerprint itself
// is unexported: its cost shows as idemretry's extra over net/http, and
// SHA256 says what one full pass of SHA-256 would be.

// BodyUnnamed is idemretry with the memory journal and no action id: the
// action is named by its plain fingerprint, a SHA-256 of the whole body,
// made before anything is sent. IdemMemory, named with WithAction, has the
// keyed one.
const BodyUnnamed = "idemretry-memory-unnamed"

// BodyNames lists the clients of BodyCost, baseline first.
var BodyNames = []string{NetHTTP, IdemMemory, BodyUnnamed}

// BodyCost: one 8 MiB POST with GetBody through the named client over
// stub. Every body is new (its first bytes are the action's number), so
// that no unnamed action is the repeat of another.
func BodyCost(b *testing.B, name string) {
	client := name
	if name == BodyUnnamed {
		client = IdemMemory
	}
	c, err := newClient(client, b.TempDir(), &stub{copyBody: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if name == BodyUnnamed {
		c.Keyed = false
	}
	p := payload(LargeBody)
	ctx := context.Background()
	b.SetBytes(LargeBody)
	b.ReportAllocs()
	cpu := procstat.CPUTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq := actionSeq.Add(1)
		stampSeq(p, seq) // stub has read all of p when Post returns
		id := ""
		if c.Keyed {
			id = "big:" + string(p[:20])
		}
		if err := c.Post(ctx, "http://stub.invalid/uploads", p, id, false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(procstat.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// SHA256: the SHA-256 of an 8 MiB body, read from a bytes.Reader as the
// fingerprint reads a GetBody copy.
func SHA256(b *testing.B) {
	p := payload(LargeBody)
	h := sha256.New()
	var sum []byte
	b.SetBytes(LargeBody)
	b.ReportAllocs()
	cpu := procstat.CPUTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.Reset()
		if _, err := bytes.NewReader(p).WriteTo(h); err != nil {
			b.Fatal(err)
		}
		sum = h.Sum(sum[:0])
	}
	b.StopTimer()
	b.ReportMetric(float64(procstat.CPUTime()-cpu)/float64(b.N), "cpu-ns/op")
}
