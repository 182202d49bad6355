//go:build !race

package filejournal

const raceEnabled = false
