//go:build unix

package procstat

import (
	"syscall"
	"time"
)

// CPUTime returns the CPU time, user and system, that the process has
// used; 0 if it cannot be read.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
