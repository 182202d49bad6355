//go:build unix

package bench

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user + system) the process has used. On a
// shared machine it moves much less with the neighbours' load than wall
// time does, so cmd/compare reports its ratio too.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
