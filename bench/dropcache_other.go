//go:build !linux

package bench

// DropCache does nothing here: there is no unprivileged way to drop a
// file from the page cache. It reports false.
func DropCache(string) (bool, error) { return false, nil }
