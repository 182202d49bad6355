package idemretry_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemretry/idemretry"
)

func TestFullJitterCeilings(t *testing.T) {
	t.Parallel()
	b := idemretry.NewFullJitter(500*time.Millisecond, 8*time.Second, maxRand{})
	var got []time.Duration
	for range 7 {
		got = append(got, b.NextBackOff()+1) // maxRand returns ceiling-1ns
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 8 * time.Second, 8 * time.Second}
	assert.Equal(t, want, got, "n = 0 for the first retry; the cap applies after")
	b.Reset()
	assert.Equal(t, 500*time.Millisecond, b.NextBackOff()+1)
}

func TestFullJitterStaysInRange(t *testing.T) {
	t.Parallel()
	base, cap := 10*time.Millisecond, 2*time.Second
	full := idemretry.NewFullJitter(base, cap, rand.New(rand.NewPCG(1, 2)))
	for n := range 200 {
		ceil := min(cap, base<<min(n, 20))
		f := full.NextBackOff()
		assert.True(t, f >= 0 && f < ceil, "full %d: %v", n, f)
	}
}

// Full jitter spreads waits over the whole window: its mean is half the
// ceiling, not the ceiling (that is what un-jittered exponential does).
func TestFullJitterIsUniform(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 7))
	var sum time.Duration
	const n = 20000
	for range n {
		sum += idemretry.NewFullJitter(time.Second, time.Second, r).NextBackOff()
	}
	mean := sum / n
	assert.InDelta(t, float64(500*time.Millisecond), float64(mean), float64(15*time.Millisecond))
}

func TestJitterReproducibleWithSeed(t *testing.T) {
	t.Parallel()
	draw := func() []time.Duration {
		b := idemretry.NewFullJitter(time.Millisecond, time.Second, rand.New(rand.NewPCG(42, 0)))
		var out []time.Duration
		for range 10 {
			out = append(out, b.NextBackOff())
		}
		return out
	}
	assert.Equal(t, draw(), draw())
}

func TestFullJitterNeverOverflows(t *testing.T) {
	t.Parallel()
	b := idemretry.NewFullJitter(time.Hour, 1<<62, nil)
	for range 100 {
		d := b.NextBackOff()
		assert.True(t, d >= 0 && d <= 1<<62, "%v", d)
	}
}
