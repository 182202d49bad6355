//go:build !windows

package filejournal

import "os"

// renameDurable renames from over to. The rename is made durable by the
// directory sync (syncDir) that callers do next; where there is none
// (datasync.Dir does nothing there; see dirsync.go), recovery's rule for
// journal.tmp covers a lost rename (see the package doc).
func renameDurable(from, to string) error { return os.Rename(from, to) }
