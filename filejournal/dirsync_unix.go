//go:build unix

package filejournal

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// syncDir makes the directory's entries (a created or renamed file) durable.
// It uses plain fsync: File.Sync on darwin is F_FULLFSYNC, which is not
// meant for directories.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	rc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fsync(int(fd))
			if !errors.Is(serr, unix.EINTR) {
				break
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fsync", Path: dir, Err: serr}
	}
	return nil
}
