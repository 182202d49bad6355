//go:build windows

package filejournal

import (
	"os"

	"golang.org/x/sys/windows"
)

// renameDurable renames from over to. On Windows it calls MoveFileEx with
// MOVEFILE_WRITE_THROUGH, which returns only once the rename is flushed to
// disk: it stands in for the directory sync Windows lacks (os.Rename does
// not ask for it).
func renameDurable(from, to string) error {
	f, err := windows.UTF16PtrFromString(from)
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	t, err := windows.UTF16PtrFromString(to)
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	if err := windows.MoveFileEx(f, t, windows.MOVEFILE_REPLACE_EXISTING|windows.MOVEFILE_WRITE_THROUGH); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}
