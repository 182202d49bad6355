package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
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
func (s *Store) needsCompaction() bool {
	s.mu.Lock()
	live := s.live
	s.mu.Unlock()
	return s.size > s.opts.CompactMinBytes && s.size > 2*(live+HeaderSize+FrameHeaderSize)
}

func (s *Store) hasExpired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, sl := range s.m {
		if s.expired(&sl, now) {
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
func (s *Store) compact() error {
	if s.f != nil {
		// A journal removed under the Store must not be recreated by a
		// compaction in a directory whose lock the Store does not hold.
		if err := s.checkPresent(); err != nil {
			return err
		}
	}
	s.mu.Lock()
	if s.poison != nil {
		err := s.poison
		s.mu.Unlock()
		return err
	}
	now := s.now()
	recs := make([]rec, 0, len(s.m))
	for id, sl := range s.m {
		if s.expired(&sl, now) {
			s.del(id)
			continue
		}
		recs = append(recs, s.recOf(id, &sl))
	}
	high, obs := s.high, s.obsNs/1e6
	s.mu.Unlock()
	if err := s.writeSnapshot(recs, high, obs); err != nil {
		// Before the rename the old file, without this mark, is still the
		// journal: the next batch must carry the mark. After it the Store
		// is poisoned and the mark no longer matters.
		return err
	}
	s.mu.Lock()
	s.savedHigh = max(s.savedHigh, high)
	s.savedObs = max(s.savedObs, obs)
	s.mu.Unlock()
	return nil
}

// writeSnapshot writes recs and an end record to journal.tmp, syncs it,
// renames it over journal (durably: renameDurable, then syncDir), and makes
// it the active file. A crash at any step leaves either the complete old
// journal or the complete new one, possibly still named journal.tmp where
// the rename cannot be made durable: Open adopts a complete journal.tmp when
// journal is missing or journal.tmp starts past journal's last frame, and
// removes it otherwise (see the package doc). A failure before the rename
// leaves the Store as it was; a failure after it poisons the Store.
func (s *Store) writeSnapshot(recs []rec, high, obs int64) (err error) {
	tmpPath := filepath.Join(s.dir, tmpName)
	of, err := os.OpenFile(tmpPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	f := s.opts.Hooks.wrap(tmpName, osFile{of})
	gen, seq := rand.Uint32(), s.nextSeq
	flags := flagSeen
	if s.opts.HashedIDs {
		flags |= flagHashedIDs
	}
	buf := header{minor: versionMinor, flags: flags, gen: gen, baseSeq: seq}.append(make([]byte, 0, 1<<20))
	var size int64
	var recBuf []byte
	count := 0
	frame := func() error {
		payload := binary.AppendUvarint(make([]byte, 0, len(recBuf)+10), uint64(count))
		payload = append(payload, recBuf...)
		buf = appendFrame(buf, gen, seq, payload)
		seq++
		recBuf, count = recBuf[:0], 0
		if len(buf) >= 1<<20 {
			if _, err := f.Write(buf); err != nil {
				return err
			}
			size += int64(len(buf))
			buf = buf[:0]
		}
		return nil
	}
	werr := func() error {
		for i := range recs {
			o := op{kind: opUpsert, r: recs[i]}
			n := len(recBuf)
			recBuf = appendOp(recBuf, &o)
			if len(recBuf)+16 > MaxPayload {
				recBuf = recBuf[:n]
				if err := frame(); err != nil {
					return err
				}
				recBuf = appendOp(recBuf, &o)
			}
			count++
		}
		if count > 0 {
			if err := frame(); err != nil {
				return err
			}
		}
		mark := op{kind: opSeen, clock: obs}
		end := op{kind: opEnd, count: uint64(len(recs)), clock: high}
		recBuf, count = appendOp(appendOp(recBuf, &mark), &end), 2
		if err := frame(); err != nil {
			return err
		}
		if _, err := f.Write(buf); err != nil {
			return err
		}
		size += int64(len(buf))
		s.opts.Hooks.fail(FPTmpWritten)
		if err := f.Sync(); err != nil {
			return err
		}
		s.opts.Hooks.fail(FPTmpSynced)
		return nil
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(tmpPath)
		return fmt.Errorf("compact: write %s: %w", tmpPath, werr)
	}

	// From the rename until the new file's identity is recorded, the
	// directory entry names a file other than s.ident: Sync's check waits.
	s.identMu.Lock()
	defer s.identMu.Unlock()
	// Windows cannot rename over an open file: close the old one first. It
	// is synced, so nothing is lost if the rename then fails.
	hadOld := s.f != nil
	if hadOld {
		cerr := s.f.Close()
		s.f = nil
		if cerr != nil {
			_ = os.Remove(tmpPath)
			s.failCompaction(fmt.Errorf("compact: close old journal: %w", cerr))
			return s.poison
		}
	}
	if err := renameDurable(tmpPath, s.path); err != nil {
		_ = os.Remove(tmpPath)
		if hadOld { // the old journal is still in place: keep using it
			if af, oerr := s.openActive(); oerr == nil {
				s.f = af
				return fmt.Errorf("compact: %w", err)
			}
		}
		s.failCompaction(fmt.Errorf("compact: rename: %w", err))
		return s.poison
	}
	s.opts.Hooks.fail(FPRenamed)
	if err := syncDir(s.dir); err != nil {
		// Appends acknowledged from now on could vanish with the directory
		// entry at a power loss: stop.
		s.failCompaction(fmt.Errorf("compact: sync directory: %w", err))
		return s.poison
	}
	s.opts.Hooks.fail(FPDirSynced)
	af, err := s.openActive()
	if err != nil {
		s.failCompaction(fmt.Errorf("compact: reopen: %w", err))
		return s.poison
	}
	s.f, s.gen, s.nextSeq, s.size = af, gen, seq, size
	s.mu.Lock()
	s.sizeSeen = size
	s.mu.Unlock()
	return nil
}

func (s *Store) failCompaction(err error) {
	s.mu.Lock()
	s.poisonLocked(err)
	s.mu.Unlock()
}

// openActive opens the journal file for appending and records its identity
// (see present). Callers hold identMu, or are Open before the Store is
// shared.
func (s *Store) openActive() (File, error) {
	of, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	fi, err := of.Stat()
	if err != nil {
		_ = of.Close()
		return nil, err
	}
	s.ident = fi
	return s.opts.Hooks.wrap(journalName, osFile{of}), nil
}

// present checks that the journal's directory entry still names the file
// the Store writes, whose identity openActive recorded: a directory (or
// file) removed, renamed or replaced under an open journal would take every
// record acknowledged from then on with it. It costs one stat of the path.
// Callers are the committer goroutine, which alone changes the file, or hold
// identMu.
func (s *Store) present() error {
	fi, err := os.Stat(s.path)
	switch {
	case err == nil && os.SameFile(fi, s.ident):
		return nil
	case err == nil, errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return &removedError{path: s.path}
	}
	return fmt.Errorf("check %s: %w", s.path, err)
}

// removedError is ErrRemoved with the path.
type removedError struct{ path string }

func (e *removedError) Error() string {
	return fmt.Sprintf("journal %s removed or replaced on disk while open", e.path)
}

func (e *removedError) Is(target error) bool { return target == ErrRemoved }

// checkPresent runs present and stops the Store if the journal is gone.
// Callers do not hold mu.
func (s *Store) checkPresent() error {
	if err := s.present(); err != nil {
		s.mu.Lock()
		s.poisonLocked(err)
		s.mu.Unlock()
		return err
	}
	return nil
}
