package occ

import "slices"

// ReferenceClients returns the client counts the reference CSV has.
func ReferenceClients() []int { return []int{10, 50, 100, 150, 190} }

// SweepClients returns the blog's sweep: N = 10, 20, ..., 190.
func SweepClients() []int {
	var ns []int
	for n := 10; n <= 190; n += 10 {
		ns = append(ns, n)
	}
	return ns
}

// DefaultRuns is the number of runs per cell of the command's default
// sweep, sized to take about 20 s on two cores. The reference counts get
// enough runs to land within the tolerances whatever the seed; the other
// counts draw the curves and feed the shape checks. N = 10 and 20 get the
// most because their runs cost next to nothing while they are the noisiest
// relative to what is checked there: at N = 10 Exponential's completion
// time has a standard deviation of 38% of its mean, and at N = 20
// Exponential makes only 1.5% fewer calls than None.
func DefaultRuns(n int) int {
	switch {
	case n <= 20:
		return 4000
	case slices.Contains(ReferenceClients(), n):
		return 1000
	default:
		return 400
	}
}
