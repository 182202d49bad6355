// Package race says whether the race detector is built in, for tests
// whose measures it changes: its instrumentation moves some values to the
// heap (allocation counts) and makes CPU-bound searches many times slower.
package race
