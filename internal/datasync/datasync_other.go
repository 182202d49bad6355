//go:build !linux

package datasync

import "os"

// File is File.Sync: F_FULLFSYNC on darwin and ios (a plain fsync there does
// not flush the drive's cache), FlushFileBuffers on Windows.
func File(f *os.File) error { return f.Sync() }
