package bench

import "github.com/idemretry/idemretry/internal/procstat"

// cpuTime is the CPU time (user + system) the process has used, 0 where it
// is not measured. On a shared machine it moves much less with the
// neighbours' load than wall time does, so cmd/compare reports its ratio
// too.
var cpuTime = procstat.CPUTime
