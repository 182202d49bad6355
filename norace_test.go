//go:build !race

package idemretry

// raceEnabled: see race_test.go.
const raceEnabled = false
