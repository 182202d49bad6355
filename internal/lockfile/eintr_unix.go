//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package lockfile

import (
	"errors"

	"golang.org/x/sys/unix"
)

// ignoringEINTR calls fn again for as long as a signal interrupts it.
func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
