//go:build race

package filejournal

// raceEnabled: the race detector is on, which makes the CRC searches of
// the property tests in scan_test.go some 25 times slower: they do less.
const raceEnabled = true
