//go:build unix

package procstat

import (
	"crypto/sha256"
	"testing"
	"time"
)

// Work done on the CPU shows in CPUTime: hashing until it has grown by a
// few milliseconds ends, and CPUTime never goes back.
func TestCPUTimeGrowsWithWork(t *testing.T) {
	before := CPUTime()
	if before <= 0 {
		t.Fatalf("CPUTime %v at the start of a running test", before)
	}
	deadline := time.Now().Add(time.Minute) // generous: a busy 2-core machine
	sum := sha256.Sum256(nil)
	last := before
	for last < before+5*time.Millisecond {
		for range 1000 {
			sum = sha256.Sum256(sum[:])
		}
		now := CPUTime()
		if now < last {
			t.Fatalf("CPUTime went back from %v to %v", last, now)
		}
		last = now
		if time.Now().After(deadline) {
			t.Fatalf("CPUTime grew from %v to only %v in a minute of hashing", before, last)
		}
	}
}
