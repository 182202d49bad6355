//go:build windows

package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

func tryLock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		ol := new(windows.Overlapped)
		ferr = windows.LockFileEx(windows.Handle(fd),
			windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	}); err != nil {
		return err
	}
	if errors.Is(ferr, windows.ERROR_LOCK_VIOLATION) || errors.Is(ferr, windows.ERROR_IO_PENDING) {
		return errBusy
	}
	return ferr
}

func unlock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		ferr = windows.UnlockFileEx(windows.Handle(fd), 0, 1, 0, new(windows.Overlapped))
	}); err != nil {
		return err
	}
	return ferr
}
