//go:build !unix

package bench

import "time"

// cpuTime is not measured here; cpu-ns/op then reads 0.
func cpuTime() time.Duration { return 0 }
