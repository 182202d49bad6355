package journal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemretry/idemretry/internal/lockfile"
)

// Report says what Open found and did.
type Report struct {
	// Records is the number of live records loaded.
	Records int
	// TornTail: the file ended in a partly written frame (a crash during a
	// write). TornBytes bytes from TornOffset were copied to TornCopy and cut
	// off. They held no acknowledged record.
	TornTail   bool
	TornOffset int64
	TornBytes  int64
	TornCopy   string
	// TornCopyErr: why the torn tail could not be copied aside (a full
	// disk, say); TornCopy is then empty. The tail was cut all the same:
	// the copy is for diagnosis only.
	TornCopyErr error
	// Salvaged lists the damaged ranges skipped because Options.Salvage was
	// set; their records are lost. The damaged file was copied to
	// CorruptCopy and the journal rewritten without them.
	Salvaged    []*CorruptionError
	CorruptCopy string
	// AdoptedTemp: a complete journal.tmp newer than journal (a crash
	// before its rename, or a rename lost at a power loss, possibly with
	// batches appended after it) was renamed over journal. RemovedTemp: a
	// leftover journal.tmp, incomplete or stale, was removed. See the
	// package doc, "journal.tmp at recovery".
	AdoptedTemp, RemovedTemp bool
	// ModeTightened lists the paths (the directory, the journal, LOCK)
	// whose permissions were wider than 0700 (directory) or 0600 (files)
	// and that Open narrowed to them, the process owning them.
	// ModeNotOwned lists those it left wider because another user owns
	// them. Both are empty on systems without Unix modes.
	ModeTightened, ModeNotOwned []string
	// Duplicates counts exact copies of earlier frames found between
	// frames (a write repeated below the file system): they hold nothing
	// new and were skipped, and the journal was rewritten without them.
	Duplicates int
	// Compacted: Open rewrote the journal (it was mostly dead records,
	// expired records, duplicated frames, or salvaged).
	Compacted bool
}

// Open opens (creating it if needed, with mode 0700) the journal in dir,
// takes its lock, recovers the file and starts the committer. The caller
// must Close the Store. An existing directory, journal or LOCK file with
// wider permissions than 0700 (directory) or 0600 (files) is narrowed to
// them if the process owns it, and reported otherwise (Report.ModeTightened,
// Report.ModeNotOwned): the journal's action ids and keys are for its owner
// alone, and a directory others can write to lets them remove the journal.
//
// Errors: one wrapping ErrLocked if another owner holds the lock after
// Options.LockWait; a *CorruptionError (ErrCorrupt) for a damaged header or
// damaged acknowledged frames without Options.Salvage; one wrapping
// ErrIncompatible for an unknown format version or a HashedIDs mismatch.
func Open(dir string, opts Options) (*Store, Report, error) {
	if err := opts.fill(); err != nil {
		return nil, Report{}, err
	}
	if err := mkdirDurable(dir); err != nil {
		return nil, Report{}, fmt.Errorf("journal: %w", err)
	}
	lk, err := lockfile.Acquire(filepath.Join(dir, lockName), opts.LockWait)
	if err != nil {
		return nil, Report{}, err
	}
	var modes Report
	for _, p := range []struct {
		path string
		max  fs.FileMode
	}{{dir, 0o700}, {filepath.Join(dir, journalName), 0o600}, {filepath.Join(dir, lockName), 0o600}} {
		tightened, notOwned, err := tighten(p.path, p.max)
		if err != nil {
			_ = lk.Release()
			return nil, Report{}, fmt.Errorf("journal: permissions: %w", err)
		}
		if tightened {
			modes.ModeTightened = append(modes.ModeTightened, p.path)
		}
		if notOwned {
			modes.ModeNotOwned = append(modes.ModeNotOwned, p.path)
		}
	}
	s := &Store{
		opts:      opts,
		dir:       dir,
		path:      filepath.Join(dir, journalName),
		lock:      lk,
		custom:    make(map[string]string),
		inflight:  make(map[string]*batch),
		deleting:  make(map[string]*batch),
		cur:       newBatch(),
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		closed:    make(chan struct{}),
		compactCh: make(chan chan error),
		obsRef:    opts.Now(),
	}
	rep, err := s.recover()
	if err == nil && s.poison != nil {
		err = s.poison
	}
	if err != nil {
		if s.f != nil {
			_ = s.f.Close()
		}
		_ = lk.Release()
		return nil, rep, err
	}
	rep.Records = len(s.m)
	rep.ModeTightened, rep.ModeNotOwned = modes.ModeTightened, modes.ModeNotOwned
	s.sizeSeen = s.size
	go s.run()
	return s, rep, nil
}

// mkdirDurable creates dir and its missing parents with mode 0700, as
// os.MkdirAll does, and then syncs the parent of each directory it created,
// shallowest first, so that a power loss cannot take the new directory (and
// the journal in it) away. It syncs nothing when dir exists.
func mkdirDurable(dir string) error {
	var created []string
	for d := filepath.Clean(dir); ; {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			break // exists, or MkdirAll will report the error
		}
		created = append(created, d)
		p := filepath.Dir(d)
		if p == d {
			break
		}
		d = p
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for i := len(created) - 1; i >= 0; i-- {
		if err := syncDir(filepath.Dir(created[i])); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) recover() (Report, error) {
	var rep Report
	// A copy aside cut short by a crash: it was never renamed to a copy's
	// name, and holds nothing recovery needs.
	_ = os.Remove(filepath.Join(s.dir, asideTmpName))
	tmpPath := filepath.Join(s.dir, tmpName)
	_, jerr := os.Stat(s.path)
	missing := errors.Is(jerr, fs.ErrNotExist)
	if jerr != nil && !missing {
		return rep, fmt.Errorf("journal: %w", jerr)
	}
	tdata, terr := os.ReadFile(tmpPath)
	switch {
	case terr == nil:
		adopt, keep, err := s.chooseTemp(tdata, tmpPath, missing)
		switch {
		case err != nil:
			return rep, err
		case adopt:
			// journal.tmp is synced: only now may it replace journal.
			if err := renameDurable(tmpPath, s.path); err != nil {
				return rep, fmt.Errorf("journal: adopt %s: %w", tmpPath, err)
			}
			if err := syncDir(s.dir); err != nil {
				return rep, fmt.Errorf("journal: %w", err)
			}
			rep.AdoptedTemp, missing = true, false
		case !keep:
			if err := os.Remove(tmpPath); err != nil {
				return rep, fmt.Errorf("journal: %w", err)
			}
			if err := syncDir(s.dir); err != nil {
				return rep, fmt.Errorf("journal: %w", err)
			}
			rep.RemovedTemp = true
		}
	case !errors.Is(terr, fs.ErrNotExist):
		return rep, fmt.Errorf("journal: %w", terr)
	}

	s.m = make(map[string]slot)
	if missing {
		// A new journal is created like a compaction's output, so that a
		// journal file, once it exists, always has a complete header.
		s.nextSeq = 1
		s.high = s.opts.Now().UnixMilli()
		return rep, s.writeSnapshot(nil, s.high, 0)
	}

	data, err := os.ReadFile(s.path)
	if err != nil {
		return rep, fmt.Errorf("journal: %w", err)
	}
	s.m = make(map[string]slot, len(data)/96)
	res, err := scan(data, s.path, s.opts.Salvage, s.applyFrame)
	if err != nil {
		return rep, err
	}
	if hashed := res.hdr.flags&flagHashedIDs != 0; hashed != s.opts.HashedIDs {
		return rep, fmt.Errorf("%w: %s was written with hashed action ids = %v", ErrIncompatible, s.path, hashed)
	}
	s.gen, s.nextSeq, s.size = res.hdr.gen, res.lastSeq+1, int64(res.end)
	s.savedHigh, s.savedObs = s.high, s.obsNs/1e6

	rep.Duplicates = len(res.dups)
	if len(res.salvaged) > 0 {
		rep.Salvaged = res.salvaged
		// Unlike a torn tail's, this copy is the only trace of the
		// acknowledged records the salvage drops: no copy, no salvage,
		// and nothing changed (it is made before the torn tail is cut).
		if rep.CorruptCopy, err = s.copyAside(corruptPref, data); err != nil {
			return rep, err
		}
	}
	if res.torn {
		rep.TornTail, rep.TornOffset, rep.TornBytes = true, int64(res.end), int64(len(data)-res.end)
		// Only the tail is copied aside, not the whole file as etcd does:
		// torn tails follow every crash during a write, and the tail is
		// all a post-mortem needs. The copy is for diagnosis only: the
		// tail holds no acknowledged record (see the package doc), and no
		// frame can be appended after it, so when the copy cannot be
		// written (a full disk) the tail is cut all the same and the
		// Report says why there is no copy. Refusing to open instead
		// would keep the application from starting, or from reconciling
		// its unfinished actions, until space is freed, and would protect
		// no acknowledged record.
		rep.TornCopy, rep.TornCopyErr = s.copyAside(tornPrefix, data[res.end:])
		if err := truncate(s.path, int64(res.end)); err != nil {
			return rep, fmt.Errorf("journal: cut torn tail: %w", err)
		}
	}

	if s.f, err = s.openActive(); err != nil {
		return rep, fmt.Errorf("journal: %w", err)
	}
	now, dead := s.now(), 0
	for id, sl := range s.m {
		if s.expired(&sl, now) {
			s.del(id)
			dead++
		}
	}
	switch {
	case len(res.salvaged) > 0:
		// The damage must not stay in the file, or every later open
		// would need salvage again.
		if err := s.compact(); err != nil {
			return rep, err
		}
		rep.Compacted = true
	case len(res.dups) > 0 || res.hdr.flags&flagSeen == 0 || s.needsCompaction() || (dead > 0 && s.size > s.opts.CompactMinBytes):
		// Also when the file predates observed times: rewritten with
		// flagSeen, it is refused by versions that would misread it.
		// Optional: a failure before the rename leaves the journal as it
		// was; one after it poisons the Store, which Open reports.
		rep.Compacted = s.compact() == nil
	}
	return rep, nil
}

// applyFrame replays one frame into the index.
func (s *Store) applyFrame(_ uint64, payload []byte) error {
	return decodePayload(payload, func(o *op) error {
		switch o.kind {
		case opUpsert:
			if sl, ok := s.m[o.r.id]; ok && s.sameKey(&sl, &o.r) {
				// The same action: an update, under the rule Update
				// follows (done is final).
				r := s.recOf(o.r.id, &sl)
				if applyUpdate(&r, o.r.state, o.r.attempts, o.r.status) {
					s.put(&r)
				}
			} else {
				if !o.r.hasSeen {
					// Written before observed times: it ages from now.
					o.r.seen, o.r.hasSeen = s.obsNs/1e6, true
				}
				s.put(&o.r)
			}
			s.high = max(s.high, o.r.created)
			s.obsNs = max(s.obsNs, o.r.seen*1e6)
		case opDelete:
			s.del(o.r.id)
		case opEnd, opClock:
			s.high = max(s.high, o.clock)
		case opSeen:
			s.obsNs = max(s.obsNs, o.clock*1e6)
		}
		return nil
	})
}

// chooseTemp decides what to do with a leftover journal.tmp, tdata (see the
// package doc, "journal.tmp at recovery"): adopt it in place of journal,
// keep it (journal cannot be read, so nothing is decided and Open reports
// journal's error), or else remove it. Whichever file wins is synced before
// chooseTemp returns, so the other is dropped only once the winner is on
// disk.
func (s *Store) chooseTemp(tdata []byte, tmpPath string, missing bool) (adopt, keep bool, err error) {
	tres, ok := checkSnapshot(tdata, tmpPath)
	if !ok {
		return false, false, nil
	}
	if !missing {
		jdata, err := os.ReadFile(s.path)
		if err != nil {
			return false, false, fmt.Errorf("journal: %w", err)
		}
		// Salvage only to learn the last valid sequence: nothing is
		// changed here, and the journal is scanned again for real below.
		jres, err := scan(jdata, s.path, true, func(uint64, []byte) error { return nil })
		if err != nil {
			return false, true, nil
		}
		if tres.hdr.baseSeq <= jres.lastSeq {
			// journal went on after journal.tmp was written: tmp is stale
			// (a failed compaction whose removal did not last).
			return false, false, syncFile(s.path)
		}
	}
	return true, false, syncFile(tmpPath)
}

// snapshotComplete reports whether data holds a whole compaction snapshot
// (see checkSnapshot).
func snapshotComplete(data []byte, path string) bool {
	_, ok := checkSnapshot(data, path)
	return ok
}

// checkSnapshot reports whether data holds a whole compaction output: a
// valid header, every frame up to the end record valid, and the end record
// counting the records before it. The snapshot may be followed by batch
// frames, appended after a rename that did not last (see the package doc):
// they must be valid too, except for a torn tail, which recovery cuts off
// as in any journal.
func checkSnapshot(data []byte, path string) (scanResult, bool) {
	var n uint64
	ended := false
	res, err := scan(data, path, false, func(_ uint64, p []byte) error {
		if ended {
			return nil // an appended batch
		}
		return decodePayload(p, func(o *op) error {
			switch {
			case ended:
			case o.kind == opUpsert:
				n++
			case o.kind == opEnd:
				if o.count != n {
					return errPayload
				}
				ended = true
			case o.kind == opSeen: // the observed time, before the end
			default:
				return errPayload // a snapshot holds only upserts, then its end
			}
			return nil
		})
	})
	return res, err == nil && ended
}

// syncFile makes the file at path durable (fdatasync where available).
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	err = datasync(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("journal: sync %s: %w", path, err)
	}
	return nil
}

// copyAside copies data, durably, to a new file named prefix and the time,
// and prunes the copies to MaxAsideCopies. The copy is written to
// asideTmpName, synced, and only then renamed to its name, so that no empty
// or partial copy is ever left under a copy's name: on any failure the
// temporary file is removed and nothing else is changed. Pruning removes
// empty copies (left by earlier versions, which created the copy before
// writing it) before any real one, then the oldest real ones.
func (s *Store) copyAside(prefix string, data []byte) (string, error) {
	name := filepath.Join(s.dir, prefix+time.Now().UTC().Format("20060102T150405.000000000"))
	tmp := filepath.Join(s.dir, asideTmpName)
	of, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("journal: copy aside: %w", err)
	}
	f := s.opts.Hooks.wrap(asideTmpName, osFile{of})
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, name)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("journal: copy aside: %w", werr)
	}
	s.pruneAside(prefix, name)
	return name, syncDir(s.dir)
}

// pruneAside removes copies named prefix* beyond MaxAsideCopies, empty ones
// first, then the oldest (their names sort by time), and any other empty
// one; it never removes keep.
func (s *Store) pruneAside(prefix, keep string) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	type copyFile struct {
		name  string
		empty bool
	}
	var copies []copyFile
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) || e.Name() == filepath.Base(keep) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		copies = append(copies, copyFile{e.Name(), fi.Size() == 0})
	}
	slices.SortFunc(copies, func(a, b copyFile) int {
		if a.empty != b.empty {
			if a.empty {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	for i, c := range copies {
		// keep makes one more: len(copies)-i+1 copies are left before this.
		if c.empty || len(copies)-i+1 > s.opts.MaxAsideCopies {
			_ = os.Remove(filepath.Join(s.dir, c.name))
		}
	}
}

func truncate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = datasync(f)
	}
	return errors.Join(err, f.Close())
}
