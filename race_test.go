//go:build race

package idemretry

// raceEnabled: the race detector's instrumentation moves some values to
// the heap, so allocation counts are checked without it.
const raceEnabled = true
