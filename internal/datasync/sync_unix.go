//go:build unix

package datasync

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Dir makes the entries of the directory dir durable (a file created in it
// or renamed into it): plain fsync, also on darwin and ios, where File.Sync
// is F_FULLFSYNC, which is not meant for directories.
func Dir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return syncFD(d, "fsync", unix.Fsync)
}

// syncFD makes the call sync, named op, on f's descriptor, again when a
// signal interrupts it; its error comes back as an *os.PathError for f.
func syncFD(f *os.File, op string, sync func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = sync(int(fd)); !errors.Is(serr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: op, Path: f.Name(), Err: serr}
	}
	return nil
}
