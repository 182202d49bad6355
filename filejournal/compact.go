package filejournal

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"

	"github.com/idemretry/idemretry/internal/datasync"
)

// Names of the files in a journal directory.
const (
	journalName = "journal"
	tmpName     = "journal.tmp"
	lockName    = "LOCK"
	tornPrefix  = "journal.torn."
	corruptPref = "journal.corrupt."
	// asideTmpName is where a copy aside is written before it is renamed
	// to its final name (see copyAside).
	asideTmpName = "journal.aside.tmp"
)

// needsCompaction: the file is past the minimum size and more than twice
// its live records, so a rewrite at least halves it.
func (j *Journal) needsCompaction() bool {
	j.mu.Lock()
	live := j.live
	j.mu.Unlock()
	return j.size > j.opts.compactMin && j.size > 2*(live+headerSize+frameHeaderSize)
}

func (j *Journal) hasExpired() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.now()
	for _, sl := range j.m {
		if j.expired(&sl, now) {
			return true
		}
	}
	return false
}

// compact rewrites the journal with its live records. It runs on the
// committer goroutine (or in Open before it starts), so no batch is written
// meanwhile. Operations queued meanwhile are already in the index, hence in
// the snapshot, and are appended again after it: replaying full-state
// records is idempotent, so the overlap is harmless.
func (j *Journal) compact() error {
	if j.f != nil {
		// A journal removed under the Journal must not be recreated by a
		// compaction in a directory whose lock the Journal does not hold.
		if err := j.checkPresent(); err != nil {
			return err
		}
		// The old file is closed at the rename: the descriptor of a failed
		// write, never.
		if err := j.repair(); err != nil {
			return err
		}
	}
	j.opts.hooks.fail(fpCompactBegin)
	j.mu.Lock()
	if j.poison != nil {
		err := j.poison
		j.mu.Unlock()
		return err
	}
	now := j.now()
	recs := make([]rec, 0, len(j.m))
	var expired map[string]slot
	for id, sl := range j.m {
		if j.expired(&sl, now) {
			if expired == nil {
				expired = make(map[string]slot)
			}
			expired[id] = *j.slots.at(sl)
			continue
		}
		recs = append(recs, j.recOf(id, &sl))
	}
	high, obs := j.high, j.obsNs/1e6
	j.mu.Unlock()
	if err := j.writeSnapshot(recs, high, obs, "compact"); err != nil {
		// Before the rename the old file, with the expired records and
		// without this mark, is still the journal: the index keeps them
		// (dropping them with no delete written would let replay take a
		// new record of one of their actions for an update of it), and the
		// next batch must carry the mark. After it the Journal is poisoned
		// and neither matters.
		return err
	}
	j.mu.Lock()
	// The expired records left the file only now. Reserve may have removed
	// one meanwhile (writing its delete) and created a new record of the
	// action, which has another observed time: drop only those unchanged.
	for id, sl := range expired {
		if cur, ok := j.m[id]; ok && *j.slots.at(cur) == sl {
			j.del(id)
		}
	}
	j.savedHigh = max(j.savedHigh, high)
	j.savedObs = max(j.savedObs, obs)
	j.mu.Unlock()
	return nil
}

// writeSnapshot writes recs and an end record to journal.tmp, syncs it,
// renames it over journal (durably: renameDurable, then syncDir), and makes
// it the active file. A crash at any step leaves either the complete old
// journal or the complete new one, possibly still named journal.tmp where
// the rename cannot be made durable: Open adopts a complete journal.tmp when
// journal is missing or journal.tmp starts past journal's last frame, and
// removes it otherwise (see the package doc). A failure before the rename
// leaves the Journal as it was, and its error names the file and the step,
// once; a failure after it poisons the Journal, with an error that names
// what ("compact", or "create" for a new journal).
func (j *Journal) writeSnapshot(recs []rec, high, obs int64, what string) error {
	snap, err := j.writeTemp(recs, high, obs)
	if err != nil {
		return err
	}
	return j.installTemp(snap, what)
}

// snapshot is a journal.tmp written and synced: the file it is (to tell it
// from another Journal's journal.tmp at the same path should the directory
// be replaced meanwhile), its generation, the sequence of the frame after
// its last, and its size.
type snapshot struct {
	made    os.FileInfo
	gen     uint32
	nextSeq uint64
	size    int64
}

// writeTemp writes recs, a frame of its own for the observed time and the
// end record to a new journal.tmp, with a new generation and the sequences
// that follow the journal's, and syncs it. On failure journal.tmp is
// removed.
func (j *Journal) writeTemp(recs []rec, high, obs int64) (snapshot, error) {
	tmpPath := filepath.Join(j.dir, tmpName)
	of, err := os.OpenFile(tmpPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return snapshot{}, err
	}
	made, err := of.Stat()
	if err != nil {
		_ = of.Close()
		_ = os.Remove(tmpPath)
		return snapshot{}, err
	}
	sw := &snapshotWriter{f: j.opts.hooks.wrap(tmpName, osFile{of})}
	snap := snapshot{made: made, gen: rand.Uint32()}
	flags := formatFlags
	if j.opts.hashed {
		flags |= flagHashedIDs
	}
	sw.buf = header{minor: versionMinor, flags: flags, gen: snap.gen, baseSeq: j.nextSeq}.append(make([]byte, 0, 1<<20))
	w := frameWriter{gen: snap.gen, seq: j.nextSeq, emit: sw.emit}
	werr := j.writeSnapshotFrames(sw, &w, recs, high, obs)
	if cerr := sw.f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(tmpPath)
		return snapshot{}, pathError("write", tmpPath, werr)
	}
	snap.nextSeq, snap.size = w.seq, sw.size
	return snap, nil
}

// writeSnapshotFrames writes the snapshot's frames through w into sw, and
// syncs them.
func (j *Journal) writeSnapshotFrames(sw *snapshotWriter, w *frameWriter, recs []rec, high, obs int64) error {
	for i := range recs {
		if err := w.add(&op{kind: opUpsert, r: recs[i]}); err != nil {
			return err
		}
	}
	if err := w.flush(); err != nil {
		return err
	}
	mark := op{kind: opSeen, clock: obs}
	end := op{kind: opEnd, count: uint64(len(recs)), clock: high}
	if err := w.write(mark, end); err != nil {
		return err
	}
	if err := sw.flush(); err != nil {
		return err
	}
	j.opts.hooks.fail(fpTmpWritten)
	if err := sw.f.Sync(); err != nil {
		return err
	}
	j.opts.hooks.fail(fpTmpSynced)
	return nil
}

// snapshotWriter gathers a snapshot's frames and writes them to f about a
// MiB at a time.
type snapshotWriter struct {
	f    file
	buf  []byte
	size int64 // bytes written to f
}

func (s *snapshotWriter) emit(frame []byte) error {
	s.buf = append(s.buf, frame...)
	if len(s.buf) >= 1<<20 {
		return s.flush()
	}
	return nil
}

func (s *snapshotWriter) flush() error {
	if _, err := s.f.Write(s.buf); err != nil {
		return err
	}
	s.size += int64(len(s.buf))
	s.buf = s.buf[:0]
	return nil
}

// installTemp renames snap, journal.tmp, over journal and makes it the
// active file (see writeSnapshot).
func (j *Journal) installTemp(snap snapshot, what string) error {
	tmpPath := filepath.Join(j.dir, tmpName)
	// From the rename until the new file's identity is recorded, the
	// directory entry names a file other than j.ident: Sync's check waits.
	j.identMu.Lock()
	defer j.identMu.Unlock()
	hadOld := j.f != nil
	if hadOld {
		if err := j.closeOld(snap.made, what); err != nil {
			return err
		}
	}
	if err := renameDurable(tmpPath, j.path); err != nil {
		removeIfSame(tmpPath, snap.made)
		return j.renameFailed(err, hadOld, what)
	}
	j.opts.hooks.fail(fpRenamed)
	if err := syncDir(j.dir); err != nil {
		// Appends acknowledged from now on could vanish with the directory
		// entry at a power loss: stop.
		j.failCompaction(fmt.Errorf("%s: sync directory: %w", what, err))
		return j.poison
	}
	j.opts.hooks.fail(fpDirSynced)
	af, err := j.openActive()
	if err != nil {
		j.failCompaction(fmt.Errorf("%s: reopen: %w", what, err))
		return j.poison
	}
	j.f, j.gen, j.nextSeq, j.size = af, snap.gen, snap.nextSeq, snap.size
	j.mu.Lock()
	j.sizeSeen = snap.size
	j.mu.Unlock()
	return nil
}

// closeOld closes the active file before the rename of journal.tmp (made)
// over it: Windows cannot rename over an open file. It is synced, so
// nothing is lost if the rename then fails. The directory must still hold
// this journal. One moved away or replaced while the snapshot was written
// (another process may hold a new journal there, under its own lock) is
// not to be renamed into, nor, after a failed rename, written to by path:
// stop. The journal.tmp made here goes if it is at that path, made in the
// new directory: left, that directory's next Open could adopt it in place
// of its own journal (another journal.tmp there is left alone). Callers
// hold identMu.
func (j *Journal) closeOld(made os.FileInfo, what string) error {
	tmpPath := filepath.Join(j.dir, tmpName)
	err := j.lockHeld()
	if err == nil {
		err = j.checkPresent()
	} else {
		j.failCompaction(err)
	}
	if err != nil {
		removeIfSame(tmpPath, made)
		return err
	}
	cerr := j.f.Close()
	j.f = nil
	if cerr != nil {
		_ = os.Remove(tmpPath)
		j.failCompaction(fmt.Errorf("%s: close old journal: %w", what, cerr))
		return j.poison
	}
	return nil
}

// renameFailed handles a failed rename of journal.tmp over journal: with
// an old journal (hadOld), still in place, it is opened again and used, if
// it is still the file the Journal wrote; else the Journal stops. Callers
// hold identMu.
func (j *Journal) renameFailed(err error, hadOld bool, what string) error {
	if hadOld {
		old := j.ident
		if af, oerr := j.openActive(); oerr == nil {
			if os.SameFile(old, j.ident) {
				j.f = af
				return err
			}
			// The path names another file now: not this journal.
			_ = af.Close()
			j.ident = old
			j.failCompaction(&removedError{path: j.path})
			return j.poison
		}
	}
	j.failCompaction(fmt.Errorf("%s: rename: %w", what, err))
	return j.poison
}

// removeIfSame removes the file at path if it is still the file fi
// describes: a journal.tmp this Journal made, not one made at the same path
// since (by another Journal, in a directory that replaced this one's).
func removeIfSame(path string, fi os.FileInfo) {
	if cur, err := os.Stat(path); err == nil && os.SameFile(cur, fi) {
		_ = os.Remove(path)
	}
}

// failCompaction stops the Journal with err (see poisonLocked). Callers do
// not hold mu.
func (j *Journal) failCompaction(err error) {
	j.mu.Lock()
	j.poisonLocked(err)
	j.mu.Unlock()
}

// openActive opens the journal file for appending and records its identity
// (see present). Callers hold identMu, or are Open before the Journal is
// shared.
func (j *Journal) openActive() (file, error) {
	of, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	fi, err := of.Stat()
	if err != nil {
		_ = of.Close()
		return nil, err
	}
	j.ident = fi
	return j.opts.hooks.wrap(journalName, osFile{of}), nil
}

// reopenActive opens the journal file afresh, for repair: it cuts it to
// size (where the failed batch began) and syncs the cut through a
// descriptor of its own (a descriptor that appends cannot cut on Windows),
// then opens it for appending. Each must be the file the Journal writes:
// another file at the path, or none, is ErrRemoved. Only the committer
// calls it.
func (j *Journal) reopenActive() (file, error) {
	cf, err := j.openSame(os.O_WRONLY)
	if err != nil {
		return nil, err
	}
	err = cf.Truncate(j.size)
	if err == nil {
		err = datasync.File(cf)
	}
	if cerr := cf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, pathError("cut", j.path, err)
	}
	af, err := j.openSame(os.O_WRONLY | os.O_APPEND)
	if err != nil {
		return nil, err
	}
	return j.opts.hooks.wrap(journalName, osFile{af}), nil
}

// openSame opens the journal file with flag, and checks that it is the file
// the Journal writes (ident): another file at the path, or none, is an
// error wrapping ErrRemoved.
func (j *Journal) openSame(flag int) (*os.File, error) {
	f, err := os.OpenFile(j.path, flag, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, &removedError{path: j.path}
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !os.SameFile(fi, j.ident) {
		err = &removedError{path: j.path}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// present checks that the journal's directory entry still names the file
// the Journal writes, whose identity openActive recorded: a directory (or
// file) removed, renamed or replaced under an open journal would take every
// record acknowledged from then on with it. It costs one stat of the path.
// Callers are the committer goroutine, which alone changes the file, or hold
// identMu.
func (j *Journal) present() error { return stillAt(j.path, j.ident) }

// lockHeld checks that LOCK is still the file whose lock the Journal
// holds. A LOCK deleted (or deleted and made again) while open takes the
// lock with it: the next Open, in any process, makes a new LOCK, locks it
// and opens the journal, and two Journals appending to one file would
// damage it. So each batch, and a compaction before its rename, checks it
// first (one stat) and, on a mismatch, the Journal stops with an error
// wrapping ErrRemoved, having written nothing more. Only the committer (or
// Open) calls it.
func (j *Journal) lockHeld() error { return stillAt(j.lockPath, j.lockIdent) }

// stillAt checks that path still names the file ident describes: an error
// wrapping ErrRemoved if it names another file or nothing (or a path
// through something no longer a directory), another error if it cannot be
// told. It costs one stat.
func stillAt(path string, ident os.FileInfo) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && os.SameFile(fi, ident):
		return nil
	case err == nil, errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return &removedError{path: path}
	}
	return pathError("check", path, err)
}

// checkPresent runs present and stops the Journal if the journal is gone
// (ErrRemoved). Callers do not hold mu.
func (j *Journal) checkPresent() error {
	err := j.present()
	if errors.Is(err, ErrRemoved) {
		j.mu.Lock()
		j.poisonLocked(err)
		j.mu.Unlock()
	}
	return err
}

// pathError is err of an operation op on path, naming path once: err
// itself when it is an *fs.PathError (which names its own), else err
// wrapped in one.
func pathError(op, path string, err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return err
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}
