package occ

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idemretry/idemretry/examples/internal/backoffs"
)

// The strategies must land on the reference's waits, whose first retry is
// n = 1 with base 5 ms: ceilings 10, 20, 40 ... 1280, then the 2000 ms cap.
func TestStrategiesMatchReferenceCeilings(t *testing.T) {
	const retries = 12
	var want []time.Duration
	for n := 1; n <= retries; n++ {
		want = append(want, min(Cap, RefBase<<n))
	}
	near := func(got, want time.Duration) bool {
		d := got - want
		return d > -time.Microsecond && d < time.Microsecond
	}
	for _, st := range Strategies() {
		b := st.New(backoffs.Top)
		prev := RefBase // the reference's decorrelated sleep0
		for i, v := range want {
			got := b.NextBackOff()
			var exp time.Duration
			switch st.Name {
			case "None":
				exp = 0
			case "Exponential", "FullJitter":
				exp = v // full jitter at the top of U(0, v)
			case "EqualJitter":
				exp = v // v/2 + the top of U(0, v/2)
			case "Decorr":
				exp = min(Cap, 3*prev) // min(cap, the top of U(base, 3*sleep))
				prev = exp
			}
			if !near(got, exp) {
				t.Fatalf("%s retry %d: wait %v, want %v", st.Name, i+1, got, exp)
			}
		}
	}
}

// And draw from the right ranges, never below their floor.
func TestStrategiesStayInRange(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, st := range Strategies() {
		b := st.New(r)
		for n := 1; n <= 15; n++ {
			v := min(Cap, RefBase<<n)
			got := b.NextBackOff()
			lo, hi := time.Duration(0), v
			switch st.Name {
			case "None":
				hi = 0
			case "Exponential":
				lo = v
			case "EqualJitter":
				lo = v / 2
			case "Decorr":
				lo, hi = RefBase, Cap
			}
			if got < lo || got > hi {
				t.Fatalf("%s retry %d: wait %v outside [%v, %v]", st.Name, n, got, lo, hi)
			}
		}
	}
}
