//go:build linux

package bench

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// datasync is fdatasync, as the file journal syncs on Linux: the data and
// the size of the appended file, not its timestamps.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = unix.Fdatasync(int(fd)); !errors.Is(serr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
