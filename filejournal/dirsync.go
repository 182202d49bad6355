package filejournal

import "github.com/idemretry/idemretry/internal/datasync"

// syncDir makes the directory's entries (a created or renamed file) durable:
// datasync.Dir, plain fsync on Unix. Windows has no directory sync: there
// renames use MoveFileEx with MOVEFILE_WRITE_THROUGH (rename_windows.go)
// instead. On the other platforms without one, a rename (of a compaction's
// or a new journal's journal.tmp) may be lost at a power loss while later
// appends to the renamed file are kept, leaving them under journal.tmp:
// recovery then adopts journal.tmp rather than deleting it (see the package
// doc, "journal.tmp at recovery").
func syncDir(dir string) error { return datasync.Dir(dir) }
