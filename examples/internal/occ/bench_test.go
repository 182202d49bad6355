package occ

import "testing"

// BenchmarkRun190 times one run of every strategy at 190 clients, the
// sweep's most expensive cell.
func BenchmarkRun190(b *testing.B) {
	var sim Sim
	strats := Strategies()
	for i := 0; b.Loop(); i++ {
		for _, st := range strats {
			sim.Run(190, st, RunRand(1, st.Name, 190, i), nil)
		}
	}
}
