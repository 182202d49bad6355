//go:build darwin || freebsd || netbsd || openbsd || dragonfly

// darwin covers ios too: GOOS=ios implies the darwin build tag.

package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

func tryLock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = unix.Flock(int(fd), unix.LOCK_EX|unix.LOCK_NB)
			if !errors.Is(ferr, unix.EINTR) {
				break
			}
		}
	}); err != nil {
		return err
	}
	if errors.Is(ferr, unix.EWOULDBLOCK) {
		return errBusy
	}
	return ferr
}

// unlock releases the flock explicitly: a fork in progress (os/exec) may
// hold a duplicate of the descriptor until its child execs.
func unlock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = unix.Flock(int(fd), unix.LOCK_UN)
			if !errors.Is(ferr, unix.EINTR) {
				break
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}
