package bench

import "testing"

// Each benchmark runs every client as a sub-benchmark; compare them with
// benchstat, or run ./cmd/compare for ratios measured in one process.

func BenchmarkPost(b *testing.B)         { each(b, Post) }
func BenchmarkPostParallel(b *testing.B) { each(b, PostParallel) }
func BenchmarkRetry(b *testing.B)        { each(b, Retry) }
func BenchmarkLargeBody(b *testing.B)    { each(b, Large) }

func each(b *testing.B, f func(*testing.B, string)) {
	for _, name := range Names {
		b.Run(name, func(b *testing.B) { f(b, name) })
	}
}
