//go:build !linux

package bench

import "os"

// datasync is File.Sync, as the file journal syncs outside Linux
// (F_FULLFSYNC on darwin, FlushFileBuffers on Windows).
func datasync(f *os.File) error { return f.Sync() }
