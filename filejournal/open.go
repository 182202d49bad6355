package filejournal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemretry/idemretry/internal/datasync"
	"github.com/idemretry/idemretry/internal/lockfile"
	"github.com/idemretry/idemretry/journal"
)

// Recovery says what Open found on disk and did about it.
type Recovery struct {
	// Records is the number of live records loaded.
	Records int
	// TornTail: the journal ended in a partly written frame, left by a crash
	// during a write. Its TornBytes bytes from TornOffset were copied to the
	// file TornCopy and cut off. They held no acknowledged record: a
	// record is acknowledged only after the sync that follows its write.
	TornTail   bool
	TornOffset int64
	TornBytes  int64
	TornCopy   string
	// TornCopyErr says why the torn tail could not be copied aside (a full
	// disk, say): TornCopy is then empty. The tail was cut all the same: it
	// held no acknowledged record, and the copy is for diagnosis only. A
	// copy is never left empty or partial.
	TornCopyErr error
	// Salvaged lists the damaged ranges that WithSalvage skipped: their
	// records are lost. The damaged file was copied to CorruptCopy; a
	// salvage whose copy cannot be written fails and changes nothing.
	Salvaged    []*CorruptionError
	CorruptCopy string
	// ModeTightened lists the paths (the directory, the journal, LOCK,
	// fingerprint.key)
	// whose permissions were wider than 0700 (directory) or 0600 (files)
	// and that Open narrowed to them, the process owning them.
	// ModeNotOwned lists those it left wider because another user owns
	// them. Both are empty on systems without Unix modes (Windows).
	ModeTightened, ModeNotOwned []string
	// Duplicates counts exact copies of earlier frames found in the file (a
	// write repeated below the file system): they held nothing new and were
	// skipped, and the journal was rewritten without them.
	Duplicates int
	// AdoptedTemp: a compaction's (or the journal's creation's) complete
	// output, journal.tmp, had not been put in place, because of a crash
	// before its rename or a rename lost at a power loss (it may then hold
	// later records too); Open finished it. RemovedTemp: an incomplete or
	// superseded journal.tmp was removed. See the package doc, "journal.tmp
	// at recovery".
	AdoptedTemp, RemovedTemp bool
	// Compacted: Open rewrote the journal (it was mostly dead records,
	// expired records, duplicated frames, or salvaged).
	Compacted bool
	// FingerprintSecretErr says why the journal has no fingerprint secret
	// (see Journal.FingerprintSecret): fingerprint.key is damaged (a
	// *CorruptionError; it is left as it is) or could not be made (a full
	// disk, say). The journal works without: new fingerprints are SHA-256,
	// and an action recorded with a keyed one is refused, nothing sent,
	// until the secret can be read again or the action's key window ends.
	FingerprintSecretErr error
	// FingerprintSecretMade: the directory had no fingerprint.key, and Open
	// made one (a new journal; one of a release before keyed fingerprints;
	// or one whose fingerprint.key was deleted, whose actions recorded with
	// keyed fingerprints are then refused, nothing sent, until their key
	// windows end).
	FingerprintSecretMade bool
}

// Open opens the file journal in dir, creating the directory (mode 0700,
// and its missing parents) and its files (mode 0600) if needed, takes its
// lock and recovers it: a torn tail left by a crash is set aside and cut
// off (see Journal.Recovery). An existing directory, journal or LOCK file
// with wider permissions is narrowed to 0700 and 0600 when the process
// owns it, and listed in Recovery.ModeNotOwned when another user does: the
// journal's action ids and keys are for its owner alone, and a directory
// others can write to lets them remove the journal. A relative dir is made
// absolute (filepath.Abs) against the working directory at Open: a later
// os.Chdir does not move the journal. The caller must Close the Journal.
//
// Errors wrap ErrInvalidOption for an option out of its range or an empty
// dir; ErrLocked if another Journal holds the directory (see
// WithLockWait); ErrCorrupt (a *CorruptionError) if acknowledged data is
// damaged, in which case nothing is changed on disk (see WithSalvage);
// journal.ErrIncompatible for a journal of an unknown or earlier format
// version, or of the other WithHashedIDs setting; or the file system's
// error.
func Open(dir string, opts ...Option) (*Journal, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return open(dir, c)
}

// openError is err of Open in dir: "idemretry: journal open <dir>: err",
// or without the dir when err names it already (a file in it, say), so
// that the message names each path once.
func openError(dir string, err error) error {
	if strings.Contains(err.Error(), dir) {
		return wrap(err, "open")
	}
	return wrap(err, "open %s", dir)
}

// Dir returns the journal's directory, as an absolute path (see Open).
func (j *Journal) Dir() string { return j.dir }

// Recovery returns what Open found and did.
func (j *Journal) Recovery() Recovery { return j.recovery }

// open is Open with a checked config.
func open(dir string, c config) (*Journal, error) {
	// Every path is kept absolute: a relative one would follow the
	// process's working directory, so that after an os.Chdir the check that
	// the journal is still there (see present) would report it removed and
	// a compaction would write journal.tmp elsewhere.
	if dir == "" {
		return nil, fmt.Errorf("%w: empty journal directory", ErrInvalidOption)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, openError(dir, err)
	}
	dir = abs
	if err := mkdirDurable(dir); err != nil {
		return nil, openError(dir, err)
	}
	j := &Journal{
		opts:     c,
		dir:      dir,
		path:     filepath.Join(dir, journalName),
		lockPath: filepath.Join(dir, lockName),
		custom:   make(map[string]string),
		inflight: make(map[string]*batch),
		deleting: make(map[string]*batch),
		cur:      newBatch(),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		closed:   make(chan struct{}),
		obsRef:   c.now(),
	}
	if err := j.lockDir(); err != nil {
		return nil, err
	}
	modes, err := j.tightenModes()
	var rep Recovery
	if err == nil {
		rep, err = j.recover()
	}
	if err == nil && j.poison != nil {
		err = j.poison
	}
	if err != nil {
		if j.f != nil {
			_ = j.f.Close()
		}
		_ = j.lock.Release()
		return nil, openError(dir, err)
	}
	rep.Records = len(j.m)
	// After recovery: a journal it refuses is left as it was.
	if j.secret, rep.FingerprintSecretMade, rep.FingerprintSecretErr = loadSecret(dir); rep.FingerprintSecretErr == nil {
		j.hasSecret = true
	}
	rep.ModeTightened, rep.ModeNotOwned = modes.ModeTightened, modes.ModeNotOwned
	j.recovery = rep
	j.sizeSeen = j.size
	go j.run()
	return j, nil
}

// lockDir takes the lock on the directory's LOCK (see Open), within the
// configured wait, and records which file it is on (see lockHeld).
func (j *Journal) lockDir() error {
	lk, err := lockfile.Acquire(j.lockPath, j.opts.lockWait)
	if errors.Is(err, lockfile.ErrLocked) {
		return &lockedError{dir: j.dir, pid: lockfile.Holder(j.lockPath)}
	}
	if err != nil {
		return openError(j.dir, err)
	}
	if j.lockIdent, err = os.Stat(j.lockPath); err != nil {
		_ = lk.Release()
		return openError(j.dir, err)
	}
	j.lock = lk
	return nil
}

// tightenModes narrows the directory and its files to 0700 and 0600 where
// the process owns them (see Open), and returns the paths it narrowed and
// those it left, in a Recovery's ModeTightened and ModeNotOwned.
func (j *Journal) tightenModes() (Recovery, error) {
	var modes Recovery
	for _, p := range []struct {
		path string
		max  fs.FileMode
	}{{j.dir, 0o700}, {j.path, 0o600}, {j.lockPath, 0o600}, {filepath.Join(j.dir, secretName), 0o600}} {
		tightened, notOwned, err := tighten(p.path, p.max)
		if err != nil {
			return modes, fmt.Errorf("permissions: %w", err)
		}
		if tightened {
			modes.ModeTightened = append(modes.ModeTightened, p.path)
		}
		if notOwned {
			modes.ModeNotOwned = append(modes.ModeNotOwned, p.path)
		}
	}
	return modes, nil
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

// recover is Open's recovery, in steps: a leftover journal.tmp settled
// (settleTemp), a new journal made or the journal replayed into the index
// (load), the file cut and compacted as replay found it (tidy).
func (j *Journal) recover() (Recovery, error) {
	var rep Recovery
	// A copy aside cut short by a crash: it was never renamed to a copy's
	// name, and holds nothing recovery needs.
	_ = os.Remove(filepath.Join(j.dir, asideTmpName))
	missing, err := j.settleTemp(&rep)
	if err != nil {
		return rep, err
	}
	j.m = make(map[string]ref)
	if missing {
		// A new journal is created like a compaction's output, so that a
		// journal file, once it exists, always has a complete header.
		j.nextSeq = 1
		j.high = j.opts.now().UnixMilli()
		return rep, j.writeSnapshot(nil, j.high, 0, "create")
	}
	res, err := j.load(&rep)
	if err != nil {
		return rep, err
	}
	return rep, j.tidy(res, &rep)
}

// settleTemp adopts or removes a leftover journal.tmp (see chooseTemp, and
// the package doc, "journal.tmp at recovery"), and reports whether there is
// no journal file (then none was adopted either).
func (j *Journal) settleTemp(rep *Recovery) (missing bool, err error) {
	tmpPath := filepath.Join(j.dir, tmpName)
	_, jerr := os.Stat(j.path)
	missing = errors.Is(jerr, fs.ErrNotExist)
	if jerr != nil && !missing {
		return false, jerr
	}
	tf, terr := os.Open(tmpPath)
	if errors.Is(terr, fs.ErrNotExist) {
		return missing, nil
	}
	if terr != nil {
		return false, terr
	}
	adopt, keep, err := j.chooseTemp(tf, tmpPath, missing)
	_ = tf.Close()
	switch {
	case err != nil:
		return false, err
	case adopt:
		// journal.tmp is synced: only now may it replace journal.
		if err := renameDurable(tmpPath, j.path); err != nil {
			return false, fmt.Errorf("adopt %s: %w", tmpPath, err)
		}
		rep.AdoptedTemp = true
		return false, syncDir(j.dir)
	case !keep:
		if err := os.Remove(tmpPath); err != nil {
			return false, err
		}
		rep.RemovedTemp = true
		return missing, syncDir(j.dir)
	}
	return missing, nil
}

// load replays the journal file into the index, reading it through one
// reusable window (see source), not whole: recovery holds the index, not
// the index and the file. It sets the file's generation, next sequence and
// size, copies aside what a salvage skips (the only trace of its records:
// no copy, no salvage) and a torn tail (for diagnosis only), and returns
// what the scan found. It changes nothing in the journal file itself.
func (j *Journal) load(rep *Recovery) (scanResult, error) {
	f, err := os.Open(j.path)
	if err != nil {
		return scanResult{}, err
	}
	defer f.Close()
	src, err := openSource(f)
	if err != nil {
		return scanResult{}, err
	}
	j.m = make(map[string]ref, countLive(src))
	res, err := scanSource(src, j.path, j.opts.salvage, j.replay())
	if err != nil {
		return res, err
	}
	size := int64(src.size)
	if hashed := res.hdr.flags&flagHashedIDs != 0; hashed != j.opts.hashed {
		return res, fmt.Errorf("%w: %s was written with hashed action ids = %v", journal.ErrIncompatible, j.path, hashed)
	}
	j.gen, j.nextSeq, j.size = res.hdr.gen, res.lastSeq+1, int64(res.end)
	j.savedHigh, j.savedObs = j.high, j.obsNs/1e6

	rep.Duplicates = len(res.dups)
	if len(res.salvaged) > 0 {
		rep.Salvaged = res.salvaged
		j.damaged = lostActions(j, res.salvaged)
		// Unlike a torn tail's, this copy is the only trace of the
		// acknowledged records the salvage drops: no copy, no salvage,
		// and nothing changed (it is made before the torn tail is cut).
		if rep.CorruptCopy, err = j.copyAside(corruptPref, io.NewSectionReader(f, 0, size)); err != nil {
			return res, err
		}
	}
	if res.torn {
		rep.TornTail, rep.TornOffset, rep.TornBytes = true, int64(res.end), size-int64(res.end)
		// Only the tail is copied aside, not the whole file as etcd does:
		// torn tails follow every crash during a write, and the tail is
		// all a post-mortem needs. The copy is for diagnosis only: the
		// tail holds no acknowledged record (see the package doc), and no
		// frame can be appended after it, so when the copy cannot be
		// written (a full disk) the tail is cut all the same and the
		// Recovery says why there is no copy. Refusing to open instead
		// would keep the application from starting, or from reconciling
		// its unfinished actions, until space is freed, and would protect
		// no acknowledged record.
		rep.TornCopy, rep.TornCopyErr = j.copyAside(tornPrefix, io.NewSectionReader(f, int64(res.end), rep.TornBytes))
	}
	// Everything is read: the file is changed (cut, compacted) only
	// through other handles, and only once this one is closed.
	return res, f.Close()
}

// tidy makes the journal file what load found: a torn tail cut off, the
// file opened for appending, and compacted when salvaged (the damage must
// not stay in the file, or every later open would need salvage again), when
// of format 1.0 (without flagKeyForm: the upserts appended from now on
// carry their keys' forms, which a release of format 1.0 must refuse as
// incompatible, not misread; see flagKeyForm), or when worth it; then the expired records that stayed in the file are
// dropped from the index, their deletes queued.
func (j *Journal) tidy(res scanResult, rep *Recovery) error {
	if res.torn {
		if err := truncate(j.path, int64(res.end)); err != nil {
			return fmt.Errorf("cut torn tail: %w", err)
		}
	}
	var err error
	if j.f, err = j.openActive(); err != nil {
		return err
	}
	dead := j.recoveredExpiredIDs()
	compactTried := true
	switch {
	case len(res.salvaged) > 0 || res.hdr.flags&flagKeyForm == 0:
		// Required: nothing is appended to the file as it is. A failure
		// fails Open, and leaves the file as it was (before the rename)
		// or rewritten (after it).
		if err := j.compact(); err != nil {
			return err
		}
		rep.Compacted = true
	case len(res.dups) > 0 || j.needsCompaction() || (len(dead) > 0 && j.size > j.opts.compactMin):
		// Optional: a failure before the rename leaves the journal as it
		// was; one after it poisons the Journal, which Open reports. (With
		// expired records in the index, live overstates the live bytes;
		// any expired record and a file past compactMin compact anyway.)
		rep.Compacted = j.compact() == nil
	default:
		compactTried = false
	}
	// Expired records that no compaction removed from the file are dropped
	// from the index with their deletes queued (written lazily, with the
	// next batch or at Close), as Reserve drops them: the decision is
	// final, and the file never holds a record the index dropped without
	// its delete on the way. Without a compaction the index is as it was
	// when dead was listed, and is not walked again.
	if compactTried {
		dead = j.recoveredExpiredIDs()
	}
	for _, id := range dead {
		j.remove(id, false)
	}
	return nil
}

// expiredIDs returns the ids of the expired records in the index.
func (j *Journal) expiredIDs() []string {
	now := j.now()
	var ids []string
	for id, sl := range j.m {
		if j.expired(&sl, now) {
			ids = append(ids, id)
		}
	}
	return ids
}

// recoveredExpiredIDs is expiredIDs for Open, which skips the walk over the
// index when no record recovery replayed can have expired: a record expires
// only once both its creation time and its observed time lie more than the
// retention back (see expired), and replay kept the earliest of each of
// every record it replayed (oldest), a bound below those of the records
// left in the index. The walk visits every record of the index in the
// map's order, a cache miss each (a fifth of the Open of a million
// records), and most Opens find nothing to drop. A record the bound misses
// could only be one that expires between the two readings of the clock:
// it is dropped at its next lookup or by the committer's expiry, as any
// record that expires while the Journal is open.
func (j *Journal) recoveredExpiredIDs() []string {
	now := j.now()
	ret := j.opts.retention.Milliseconds()
	if !longerAgo(now.wall, j.oldest.wall, ret) || !longerAgo(now.obs, j.oldest.obs, ret) {
		return nil
	}
	return j.expiredIDs()
}

// longerAgo reports whether t lies more than d before now (d >= 0), with
// no overflow: a creation time is whatever a record or a file says, down
// to math.MinInt64.
func longerAgo(now, t, d int64) bool {
	return now > t && uint64(now)-uint64(t) > uint64(d)
}

// replay returns the function that scan calls to replay one frame into the
// index. It allocates no string for a record's id but the map key of a
// record it adds, taken from an idArena.
func (j *Journal) replay() func(seq uint64, payload []byte) error {
	var ids idArena
	j.oldest = times{wall: math.MaxInt64, obs: math.MaxInt64}
	apply := func(o *op, id []byte) error {
		switch o.kind {
		case opUpsert:
			sl, ok := j.m[string(id)]
			if ok && j.slots.at(sl).custom() {
				o.r.id = string(id) // sameKey compares the custom keys by id
			}
			switch {
			case ok && j.sameKey(&sl, &o.r):
				// The same action: an update, under the rule Update
				// follows (done is final).
				r := j.recOf(o.r.id, &sl)
				if applyUpdate(&r, o.r.state, o.r.attempts, o.r.status) {
					if r.id == "" {
						r.id = string(id)
					}
					j.put(&r)
				}
			case ok:
				// Another record of the action, with another key.
				if o.r.id == "" {
					o.r.id = string(id)
				}
				j.put(&o.r)
			default:
				// A new record: what put does, without its lookup.
				o.r.id = ids.string(id)
				j.m[o.r.id] = j.slots.alloc(j.slotOf(&o.r))
				if o.r.custom != "" {
					j.custom[o.r.id] = o.r.custom
				}
				j.live += o.r.size()
			}
			j.high = max(j.high, o.r.created)
			j.obsNs = max(j.obsNs, o.r.seen*1e6)
			j.oldest.wall = min(j.oldest.wall, o.r.created)
			j.oldest.obs = min(j.oldest.obs, o.r.seen)
		case opDelete:
			if _, ok := j.m[string(id)]; ok {
				j.del(string(id))
			}
		case opEnd, opClock:
			j.high = max(j.high, o.clock)
		case opSeen:
			j.obsNs = max(j.obsNs, o.clock*1e6)
		}
		return nil
	}
	var o op
	return func(_ uint64, payload []byte) error { return decodeOpsInto(payload, &o, apply) }
}

// idArena makes the id strings of the records that recovery adds to the
// index, many to an allocation instead of one each: a million small
// allocations cost more time than the map they go into. An arena's chunk
// stays allocated while any of its ids is in the index, so the memory a
// chunk holds after its records are removed is bounded by the ids that
// recovery loaded.
type idArena struct{ b strings.Builder }

const idChunk = 4 << 10

func (a *idArena) string(id []byte) string {
	if a.b.Cap()-a.b.Len() < len(id) {
		a.b = strings.Builder{}
		a.b.Grow(max(idChunk, len(id)))
	}
	a.b.Write(id)
	s := a.b.String()
	return s[len(s)-len(id):]
}

// chooseTemp decides what to do with a leftover journal.tmp, tf (see the
// package doc, "journal.tmp at recovery"): adopt it in place of journal,
// keep it (journal cannot be read, so nothing is decided and Open reports
// journal's error), or else remove it. Whichever file wins is synced before
// chooseTemp returns, so the other is dropped only once the winner is on
// disk.
func (j *Journal) chooseTemp(tf *os.File, tmpPath string, missing bool) (adopt, keep bool, err error) {
	tsrc, err := openSource(tf)
	if err != nil {
		return false, false, err
	}
	tres, ended, terr := scanSnapshot(tsrc, tmpPath)
	// Frames after the snapshot's end record were appended to it as the
	// journal, after its sync and its rename (a lost one): damage with a
	// valid frame after it, among them or in the snapshot, is damage to
	// acknowledged data, reported (or salvaged once journal.tmp is
	// adopted), never removed with the file. Damage in a journal.tmp with
	// nothing after its end record is not: the snapshot is written whole,
	// then synced, so a crash before its sync can leave any of it missing.
	var ce *CorruptionError
	if terr != nil && !errors.As(terr, &ce) {
		return false, false, terr // not read: nothing is decided
	}
	damaged := ce != nil && (ended || appendedAfterEnd(tsrc, tmpPath))
	if !damaged && (terr != nil || !ended) {
		return false, false, nil
	}
	if !missing {
		jf, err := os.Open(j.path)
		if err != nil {
			return false, false, err
		}
		defer jf.Close()
		jsrc, err := openSource(jf)
		if err != nil {
			return false, false, err
		}
		// Salvage only to learn the last valid sequence: nothing is
		// changed here, and the journal is scanned again for real below.
		jres, err := scanSource(jsrc, j.path, true, func(uint64, []byte) error { return nil })
		if err != nil {
			return false, true, nil
		}
		if tres.hdr.baseSeq <= jres.lastSeq {
			// journal went on after journal.tmp was written: tmp is stale
			// (a failed compaction whose removal did not last).
			return false, false, syncFile(j.path)
		}
	}
	if damaged && !j.opts.salvage {
		return false, true, ce
	}
	return true, false, syncFile(tmpPath)
}

// scanSnapshot scans src, a compaction's output, without salvage, and
// reports whether its frames reached the snapshot's end record (counting
// the records before it) and the scan's error, if any.
func scanSnapshot(src *source, path string) (scanResult, bool, error) {
	var n uint64
	ended := false
	res, err := scanSource(src, path, false, func(_ uint64, p []byte) error {
		if ended {
			return nil // an appended batch
		}
		return decodeOps(p, func(o *op, _ []byte) error {
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
	return res, ended, err
}

// appendedAfterEnd reports whether src, a damaged compaction output, holds
// a valid frame after one that holds an end record: then it was renamed
// and appended to as the journal, so it was synced whole before, and its
// damage is damage to acknowledged data. (A compaction that crashed before
// its sync wrote nothing after its end record.)
func appendedAfterEnd(src *source, path string) bool {
	sawEnd, after := false, false
	_, err := scanSource(src, path, true, func(_ uint64, p []byte) error {
		if sawEnd {
			after = true
			return nil
		}
		return decodeOps(p, func(o *op, _ []byte) error {
			sawEnd = sawEnd || o.kind == opEnd
			return nil
		})
	})
	return err == nil && after
}

// syncFile makes the file at path durable (fdatasync where available).
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = datasync.File(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// copyAside copies what data reads, durably, to a new file named prefix
// and the time, and prunes the copies to maxAside. The copy is written to asideTmpName,
// synced, and only then renamed to its name, so that no empty or partial
// copy is ever left under a copy's name: on any failure the temporary file
// is removed and nothing else is changed.
func (j *Journal) copyAside(prefix string, data io.Reader) (string, error) {
	name := filepath.Join(j.dir, prefix+time.Now().UTC().Format("20060102T150405.000000000"))
	tmp := filepath.Join(j.dir, asideTmpName)
	of, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("copy aside: %w", err)
	}
	f := j.opts.hooks.wrap(asideTmpName, osFile{of})
	// Through f's Write only (no io.ReaderFrom), in pieces of a bounded
	// buffer.
	_, werr := io.CopyBuffer(struct{ io.Writer }{f}, data, make([]byte, 256<<10))
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
		return "", fmt.Errorf("copy aside: %w", werr)
	}
	j.pruneAside(prefix, name)
	return name, syncDir(j.dir)
}

// pruneAside removes the oldest copies named prefix* (their names sort by
// time) beyond maxAside, keep included; it never removes keep.
func (j *Journal) pruneAside(prefix, keep string) {
	ents, err := os.ReadDir(j.dir) // sorted by name
	if err != nil {
		return
	}
	var copies []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && e.Name() != filepath.Base(keep) {
			copies = append(copies, e.Name())
		}
	}
	for len(copies)+1 > j.opts.maxAside && len(copies) > 0 {
		_ = os.Remove(filepath.Join(j.dir, copies[0]))
		copies = copies[1:]
	}
}

func truncate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = datasync.File(f)
	}
	return errors.Join(err, f.Close())
}

// lostActions returns the actions whose records the damaged ranges that
// salvage skipped may have changed, read from their upserts (see
// CorruptionError.Actions): each that the index holds under no key or
// under another key than the damaged upsert's (a record of the action
// made anew, or the upsert's key damaged: the record it holds may be the
// older one), by stored id, each with the error that says where it was
// lost; nil if there are none. An upsert with the key of the record held
// was an update of it: the record is kept, and the update lost (a resend
// gets the server's replay).
func lostActions(j *Journal, salvaged []*CorruptionError) map[string]error {
	var lost map[string]error
	for _, ce := range salvaged {
		for _, u := range ce.upserts {
			if lost[u.id] != nil {
				continue
			}
			if sl, held := j.m[u.id]; held && j.sameKey(&sl, &rec{id: u.id, key: u.key, custom: u.custom}) {
				continue
			}
			if lost == nil {
				lost = make(map[string]error)
			}
			lost[u.id] = &lostError{action: j.reportedID(u.id), ce: ce}
		}
	}
	return lost
}
