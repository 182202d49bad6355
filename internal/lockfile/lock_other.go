//go:build !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly && !windows

package lockfile

import (
	"errors"
	"os"
)

// On other systems there is no lock that survives kill -9 semantics we trust:
// refuse rather than pretend to exclude.
func tryLock(*os.File) error { return errors.ErrUnsupported }

func unlock(*os.File) error { return nil }
