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
		ferr := flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if ferr != nil && !flockMissing(ferr) {
			return ferr
		}
		// The open-file-description lock too, always: where flock is
		// missing (seen on Android 14) or filtered by a seccomp policy it
		// is the only lock, and flock and OFD locks do not see each other
		// on Linux, so a process with flock must hold both to exclude one
		// without.
		oerr := ofdLock(fd)
		switch {
		case oerr == nil:
			return nil
		case ferr == nil && !errors.Is(oerr, errBusy):
			return nil // no OFD locks on this file system: flock alone
		case ferr == nil:
			_ = flock(fd, unix.LOCK_UN)
		}
		return oerr
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
		lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart}
		oerr := ignoringEINTR(func() error { return unix.FcntlFlock(fd, unix.F_OFD_SETLK, &lk) })
		if ferr := flock(fd, unix.LOCK_UN); !flockMissing(ferr) {
			return ferr // the OFD lock, if any, goes with the descriptor
		}
		return oerr
	})
}
