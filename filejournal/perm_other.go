//go:build !unix

package filejournal

import "io/fs"

// tighten does nothing where permissions are not Unix modes (Windows: the
// directory inherits the ACL of its parent, the user's profile).
func tighten(string, fs.FileMode) (tightened, notOwned bool, err error) {
	return false, false, nil
}
