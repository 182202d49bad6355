package bench

import (
	"context"
	"testing"
)

// BenchmarkOverhead measures what each wrapper itself costs per action, with
// no network under it: the base RoundTripper consumes the body and answers
// at once. Loopback HTTP is ~45 µs and ~80 allocations of noise around a few
// microseconds of difference; here the difference is all there is, so this
// is where to look before and after changing idemretry's hot path.
// nethttp is http.Client over the stub alone.
func BenchmarkOverhead(b *testing.B) {
	for _, flaky := range []bool{false, true} {
		kind := "ok"
		if flaky {
			kind = "503-then-201"
		}
		for _, name := range []string{NetHTTP, IdemMemory, RetryableHTTP, Failsafe} {
			b.Run(kind+"/"+name, func(b *testing.B) {
				st := &stub{flaky: flaky}
				c, err := newClient(name, b.TempDir(), st)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				p := payload(SmallBody)
				ctx := context.Background()
				// An application has its ids already (see actionIDs); every
				// client holds them, so that all run with one live heap.
				ids := newActionIDs(b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					id := ""
					if c.Keyed {
						id = ids.next()
					}
					// The stub alternates by itself: no ActionHeader needed.
					if err := c.Post(ctx, "http://stub.invalid/charges", p, id, false); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
