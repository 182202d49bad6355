package filejournal

import (
	"os"

	"github.com/idemretry/idemretry/internal/datasync"
)

// file is what the Journal writes journal files through. The real one is
// an *os.File whose Sync is fdatasync on Linux and Android and File.Sync
// elsewhere (F_FULLFSYNC on darwin and ios, FlushFileBuffers on Windows).
// Tests wrap it (hooks.wrapFile) to inject write and sync failures.
type file interface {
	Write(p []byte) (int, error)
	// Sync makes every byte written so far durable. After an error the
	// Journal never calls it again on the same file: whether the data
	// reached the disk is unknowable (PostgreSQL's "fsyncgate").
	Sync() error
	Close() error
}

// hooks are test seams. The zero value does nothing.
type hooks struct {
	// failpoint, if set, is called at each named point (the fp* constants)
	// of the write and compaction paths, from the goroutine doing the work.
	// A crash test exits the process there.
	failpoint func(name string)
	// wrapFile, if set, wraps each file the Journal opens for writing; name
	// is its base name ("journal", "journal.tmp" or "journal.aside.tmp").
	wrapFile func(name string, f file) file
}

// Failpoint names.
const (
	fpBeforeWrite  = "before-write"      // a batch's frame is encoded, not written
	fpAfterWrite   = "after-write"       // written, not synced
	fpAfterSync    = "after-sync"        // synced, waiters not yet acknowledged
	fpCompactBegin = "compact-begin"     // the journal checked present, journal.tmp not yet made
	fpTmpWritten   = "compact-written"   // journal.tmp written, not synced
	fpTmpSynced    = "compact-synced"    // journal.tmp synced, not renamed
	fpRenamed      = "compact-renamed"   // renamed over journal, directory not synced
	fpDirSynced    = "compact-dirsynced" // directory synced, new file not yet active
	fpWake         = "committer-wake"    // the committer woke up (counted by tests)
)

func (h *hooks) fail(name string) {
	if h != nil && h.failpoint != nil {
		h.failpoint(name)
	}
}

func (h *hooks) wrap(name string, f file) file {
	if h != nil && h.wrapFile != nil {
		return h.wrapFile(name, f)
	}
	return f
}

// osFile is the real file.
type osFile struct{ *os.File }

func (f osFile) Sync() error { return datasync.File(f.File) }
