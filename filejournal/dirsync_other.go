//go:build !unix

package filejournal

// syncDir does nothing: Windows has no directory fsync. There renames use
// MoveFileEx with MOVEFILE_WRITE_THROUGH (rename_windows.go) instead. On the
// other platforms without a directory sync, a rename (of a compaction's or
// a new journal's journal.tmp) may be lost at a power loss while later
// appends to the renamed file are kept, leaving them under journal.tmp:
// recovery then adopts journal.tmp rather than deleting it (see the package
// doc, "journal.tmp at recovery").
func syncDir(string) error { return nil }
