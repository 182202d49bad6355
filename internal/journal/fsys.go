package journal

import (
	"os"
)

// File is what the Store writes journal files through. The real one is an
// *os.File whose Sync is fdatasync on Linux and Android and File.Sync
// elsewhere (F_FULLFSYNC on darwin and ios, FlushFileBuffers on Windows).
// Tests wrap it (Hooks.WrapFile) to inject write and sync failures.
type File interface {
	Write(p []byte) (int, error)
	// Sync makes every byte written so far durable. After an error the
	// Store never calls it again on the same File: whether the data
	// reached the disk is unknowable (PostgreSQL's "fsyncgate").
	Sync() error
	Close() error
}

// Hooks are test seams. The zero value does nothing.
type Hooks struct {
	// Failpoint, if set, is called at each named point (the FP* constants)
	// of the write and compaction paths, from the goroutine doing the work.
	// A crash test exits the process there.
	Failpoint func(name string)
	// WrapFile, if set, wraps each file the Store opens for writing; name
	// is its base name ("journal" or "journal.tmp").
	WrapFile func(name string, f File) File
}

// Failpoint names.
const (
	FPBeforeWrite = "before-write"      // a batch's frame is encoded, not written
	FPAfterWrite  = "after-write"       // written, not synced
	FPAfterSync   = "after-sync"        // synced, waiters not yet acknowledged
	FPTmpWritten  = "compact-written"   // journal.tmp written, not synced
	FPTmpSynced   = "compact-synced"    // journal.tmp synced, not renamed
	FPRenamed     = "compact-renamed"   // renamed over journal, directory not synced
	FPDirSynced   = "compact-dirsynced" // directory synced, new file not yet active
)

func (h *Hooks) fail(name string) {
	if h != nil && h.Failpoint != nil {
		h.Failpoint(name)
	}
}

func (h *Hooks) wrap(name string, f File) File {
	if h != nil && h.WrapFile != nil {
		return h.WrapFile(name, f)
	}
	return f
}

// osFile is the real File.
type osFile struct{ *os.File }

func (f osFile) Sync() error { return datasync(f.File) }
