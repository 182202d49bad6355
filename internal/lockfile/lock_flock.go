//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package lockfile

import (
	"errors"

	"golang.org/x/sys/unix"
)

// flock makes the flock(2) call how (unix.LOCK_EX|unix.LOCK_NB to take the
// lock, unix.LOCK_UN to release it) on fd, again when a signal interrupts
// it; a lock held by another owner is errBusy.
func flock(fd uintptr, how int) error {
	err := ignoringEINTR(func() error { return unix.Flock(int(fd), how) })
	if errors.Is(err, unix.EWOULDBLOCK) {
		return errBusy
	}
	return err
}
