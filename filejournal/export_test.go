package filejournal

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/idemretry/idemretry/journal"
)

// Test-only seams and views of a Journal, and helpers only tests use.

// scan reads data, a whole journal file in memory, and calls apply for each
// good frame in order: scanSource over data.
func scan(data []byte, path string, salvage bool, apply func(seq uint64, payload []byte) error) (scanResult, error) {
	return scanSource(memSource(data), path, salvage, apply)
}

// snapshotComplete reports whether data holds a whole compaction output: a
// valid header, every frame up to the end record valid, and the end record
// counting the records before it. The snapshot may be followed by batch
// frames, appended after a rename that did not last (see the package doc):
// they must be valid too, except for a torn tail, which recovery cuts off
// as in any journal.
func snapshotComplete(data []byte, path string) bool {
	_, ended, err := scanSnapshot(memSource(data), path)
	return err == nil && ended
}

// appendPayload encodes ops as one payload.
func appendPayload(b []byte, ops []op) []byte {
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for i := range ops {
		b = appendOp(b, &ops[i])
	}
	return b
}

// decodePayload calls fn for each record of p, with its id, reusing one
// op. It returns errPayload (wrapped) for anything malformed, and fn's
// error as is.
func decodePayload(p []byte, fn func(*op) error) error {
	return decodeOps(p, func(o *op, id []byte) error {
		if id != nil {
			o.r.id = string(id)
		}
		return fn(o)
	})
}

// withHooks installs failpoints and file wrappers.
func withHooks(h *hooks) Option {
	return func(c *config) { c.hooks = h }
}

// withCompactMin lowers the file size below which no compaction runs.
func withCompactMin(n int64) Option {
	return func(c *config) { c.compactMin = n }
}

// get returns the unexpired record of a stored id.
func (j *Journal) get(id string) (journal.Record, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.usable(); err != nil {
		return journal.Record{}, false, err
	}
	sl, ok := j.m[id]
	if !ok || j.expired(&sl, j.now()) {
		return journal.Record{}, false, nil
	}
	r := j.recOf(id, &sl)
	return r.record(id), true, nil
}

// stats describes a Journal.
type stats struct {
	Records   int   // live records in memory
	LiveBytes int64 // their encoded size
	FileBytes int64 // the journal file's size after the last batch
}

func (j *Journal) stats() stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return stats{Records: len(j.m), LiveBytes: j.live, FileBytes: j.sizeSeen}
}

// RunSpread is runSpread, for the package's external benchmarks.
var RunSpread = runSpread

// WithSyncCount counts the syncs of the journal file into n (countingFile):
// for benchmarks that report syncs per action. It replaces the hooks.
func WithSyncCount(n *atomic.Int64) Option {
	return withHooks(&hooks{wrapFile: func(name string, f file) file {
		if name != journalName {
			return f
		}
		return countingFile{f, n}
	}})
}

// WithSyncGate makes a Sync of the journal file wait for release to be
// closed whenever hang returns true for it (asked once per Sync, before
// it): a hung fdatasync, for the package's external tests. It replaces the
// hooks.
func WithSyncGate(hang func() bool, release <-chan struct{}) Option {
	return withHooks(&hooks{wrapFile: func(name string, f file) file {
		if name != journalName {
			return f
		}
		return gatedFile{f, hang, release}
	}})
}

// gatedFile is WithSyncGate's file.
type gatedFile struct {
	file
	hang    func() bool
	release <-chan struct{}
}

func (f gatedFile) Sync() error {
	if f.hang() {
		<-f.release
	}
	return f.file.Sync()
}

// SmallFSOf, Fill and Unfill are smallFSOf, fill and unfill, for the
// package's external tests.
var (
	SmallFSOf = smallFSOf
	Fill      = fill
	Unfill    = unfill
)

// AllRecords returns every unexpired record, by key: for the package's
// external tests, which cannot name the records of actions named by their
// fingerprint.
func (j *Journal) AllRecords() map[string]journal.Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make(map[string]journal.Record, len(j.m))
	now := j.now()
	for id, sl := range j.m {
		if !j.expired(&sl, now) {
			r := j.recOf(id, &sl)
			out[r.record(j.reportedID(id)).Key] = r.record(j.reportedID(id))
		}
	}
	return out
}
