//go:build linux || darwin

package main

import (
	"os"
	"syscall"
)

// canKill: this platform has SIGKILL.
const canKill = true

// kill sends p SIGKILL: the process ends at once, with no chance to flush
// or close anything.
func kill(p *os.Process) error { return p.Signal(syscall.SIGKILL) }

// killed reports whether the process ended by SIGKILL.
func killed(ps *os.ProcessState) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
