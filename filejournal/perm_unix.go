//go:build unix

package filejournal

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// tighten narrows path's permissions to at most max (0700 for the
// directory, 0600 for files) when the process owns it; it reports whether
// it changed them, and whether they are wider than max and were left so
// because another user owns path. A missing path is neither.
func tighten(path string, max fs.FileMode) (tightened, notOwned bool, err error) {
	fi, err := os.Lstat(path)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		// A link's own mode means nothing, and Chmod follows it: judge
		// what it points to (nothing, if it dangles).
		fi, err = os.Stat(path)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	perm := fi.Mode().Perm()
	if perm&^max == 0 {
		return false, false, nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return false, true, nil
	}
	keep := fi.Mode() & (fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if err := os.Chmod(path, keep|perm&max); err != nil {
		return false, false, err
	}
	return true, false, nil
}
