//go:build race

package filejournal

// hw4Race: the race detector is on, which makes the CRC searches of the
// review_hw4 property tests some 25 times slower: they do less.
const hw4Race = true
