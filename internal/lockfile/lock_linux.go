//go:build linux

// This file also serves Android, whose GOOS implies the linux build tag.

package lockfile

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

func tryLock(f *os.File) error {
	return control(f, func(fd uintptr) error {
		err := flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if flockMissing(err) {
			// flock is missing (seen on Android 14) or filtered by a
			// seccomp policy: open-file-description locks have the same
			// per-description semantics.
			return ofdLock(fd)
		}
		return err
	})
}

// flockMissing reports whether err, from flock, says that flock cannot be
// used here (ENOSYS, EOPNOTSUPP, or EPERM from a seccomp filter).
func flockMissing(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM)
}

func ofdLock(fd uintptr) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	err := ignoringEINTR(func() error { return unix.FcntlFlock(fd, unix.F_OFD_SETLK, &lk) })
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return errBusy
	}
	return err
}

// unlock releases the lock explicitly before the descriptor is closed: a
// process that forks (os/exec does) briefly shares the open file
// description with its child until the child execs, and closing our
// descriptor alone would leave the lock held until then.
func unlock(f *os.File) error {
	return control(f, func(fd uintptr) error {
		err := flock(fd, unix.LOCK_UN)
		if flockMissing(err) {
			lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart}
			err = ignoringEINTR(func() error { return unix.FcntlFlock(fd, unix.F_OFD_SETLK, &lk) })
		}
		return err
	})
}
