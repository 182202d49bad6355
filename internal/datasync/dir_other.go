//go:build !unix

package datasync

// Dir does nothing: these systems (Windows) have no directory sync.
func Dir(string) error { return nil }
