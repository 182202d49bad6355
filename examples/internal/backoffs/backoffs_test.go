package backoffs

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Each backoff draws from its range: equal jitter from the upper half of
// the exponential ceiling, decorrelated jitter from [Base, 3*previous)
// within Cap, plain exponential exactly the ceiling.
func TestStayInRange(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base, cap := 10*time.Millisecond, 2*time.Second
	equal := NewEqualJitter(base, cap, r)
	decor := NewDecorrelatedJitter(base, cap, r)
	exp := NewExponential(base, cap)
	prev := base
	for n := range 200 {
		ceil := min(cap, base<<min(n, 20))
		if e := equal.NextBackOff(); e < ceil/2 || e >= ceil {
			t.Errorf("equal %d: %v outside [%v, %v)", n, e, ceil/2, ceil)
		}
		if d := decor.NextBackOff(); d < base || d > cap || d >= 3*prev {
			t.Errorf("decorrelated %d: %v after %v", n, d, prev)
		} else {
			prev = max(d, base)
		}
		if x := exp.NextBackOff(); x != ceil {
			t.Errorf("exponential %d: %v, want %v", n, x, ceil)
		}
	}
}

// At the top of every draw the jittered backoffs show their ceilings, and
// Reset starts each sequence again.
func TestCeilingsAndReset(t *testing.T) {
	base, cap := 500*time.Millisecond, 8*time.Second
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 8 * time.Second}
	for _, b := range []backoff.BackOff{NewEqualJitter(base, cap, Top), NewExponential(base, cap)} {
		for round := range 2 {
			for i, w := range want {
				if got := b.NextBackOff().Round(time.Millisecond); got != w {
					t.Fatalf("%T round %d, retry %d: %v, want %v", b, round, i+1, got, w)
				}
			}
			b.Reset()
		}
	}
	d := NewDecorrelatedJitter(base, cap, Top)
	for round := range 2 {
		for i, w := range []time.Duration{1500 * time.Millisecond, 4500 * time.Millisecond, cap, cap} {
			if got := d.NextBackOff().Round(time.Millisecond); got != w {
				t.Fatalf("decorrelated round %d, retry %d: %v, want %v", round, i+1, got, w)
			}
		}
		d.Reset()
	}
}

func TestNeverOverflow(t *testing.T) {
	for _, b := range []backoff.BackOff{
		NewEqualJitter(time.Hour, 1<<62, nil),
		NewDecorrelatedJitter(time.Hour, 1<<62, nil),
		NewExponential(time.Hour, 1<<62),
	} {
		for range 100 {
			if d := b.NextBackOff(); d < 0 || d > 1<<62 {
				t.Fatalf("%T: %v", b, d)
			}
		}
	}
}
