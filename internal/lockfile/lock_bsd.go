//go:build darwin || freebsd || netbsd || openbsd || dragonfly

// darwin covers ios too: GOOS=ios implies the darwin build tag.

package lockfile

import (
	"os"

	"golang.org/x/sys/unix"
)

func tryLock(f *os.File) error {
	return control(f, func(fd uintptr) error { return flock(fd, unix.LOCK_EX|unix.LOCK_NB) })
}

// unlock releases the flock explicitly: a fork in progress (os/exec) may
// hold a duplicate of the descriptor until its child execs.
func unlock(f *os.File) error {
	return control(f, func(fd uintptr) error { return flock(fd, unix.LOCK_UN) })
}
