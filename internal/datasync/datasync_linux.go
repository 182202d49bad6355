//go:build linux

package datasync

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// File is fdatasync: it flushes the data and the metadata needed to read it
// back (the size of an appended file), not timestamps. An interrupted call
// is made again.
func File(f *os.File) error {
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
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}
