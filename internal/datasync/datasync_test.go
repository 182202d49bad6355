package datasync

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFileSyncsWrittenData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("payload")); err != nil {
		t.Fatal(err)
	}
	if err := File(f); err != nil {
		t.Fatalf("File: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "payload" {
		t.Fatalf("read back %q, %v", got, err)
	}
}

func TestFileOnClosedFileFails(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := File(f); err == nil {
		t.Fatal("File on a closed file reported no error")
	}
}
