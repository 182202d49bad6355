//go:build linux

package datasync

import (
	"os"

	"golang.org/x/sys/unix"
)

// File is fdatasync: it flushes the data and the metadata needed to read it
// back (the size of an appended file), not timestamps. An interrupted call
// is made again.
func File(f *os.File) error { return syncFD(f, "fdatasync", unix.Fdatasync) }
