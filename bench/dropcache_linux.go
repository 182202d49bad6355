//go:build linux

package bench

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DropCache asks the kernel to drop the files in dir from the page cache
// (posix_fadvise POSIX_FADV_DONTNEED; the files are synced first, since
// dirty pages are not dropped), so that the next read of them comes from
// the disk. It needs no privilege, and the kernel may keep some pages; it
// reports whether it could ask.
func DropCache(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return false, err
	}
	for _, name := range files {
		fi, err := os.Stat(name)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return false, err
		}
		err = f.Sync()
		if err == nil {
			err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		}
		f.Close()
		if err != nil {
			return false, err
		}
	}
	return true, nil
}
