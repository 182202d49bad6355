//go:build unix

package datasync

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestDirSyncsADirectoryWithANewFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("payload"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Dir(dir); err != nil {
		t.Fatalf("Dir: %v", err)
	}
}

func TestDirOfAMissingDirectoryFails(t *testing.T) {
	if err := Dir(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Dir of a missing directory: %v, want fs.ErrNotExist", err)
	}
}
