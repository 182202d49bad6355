//go:build windows

package lockfile

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

func tryLock(f *os.File) error {
	return control(f, func(fd uintptr) error {
		err := windows.LockFileEx(windows.Handle(fd),
			windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, new(windows.Overlapped))
		if errors.Is(err, windows.ERROR_LOCK_VIOLATION) || errors.Is(err, windows.ERROR_IO_PENDING) {
			return errBusy
		}
		return err
	})
}

func unlock(f *os.File) error {
	return control(f, func(fd uintptr) error {
		return windows.UnlockFileEx(windows.Handle(fd), 0, 1, 0, new(windows.Overlapped))
	})
}
