//go:build !linux

package filejournal

import "os"

// datasync is File.Sync: F_FULLFSYNC on darwin and ios (a plain fsync there
// does not flush the drive's cache), FlushFileBuffers on Windows.
func datasync(f *os.File) error { return f.Sync() }
