package idemretry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/idemretry/idemretry/journal"

	engine "github.com/idemretry/idemretry/internal/journal"
)

// FileJournal is the file-backed journal.Journal that NewClient and NewTransport use
// by default. It keeps, per action, the action id (or its SHA-256, see
// WithHashedActionIDs), the key (16 bytes for a UUID), the request
// fingerprint, the creation time, the state, the attempt count and the final
// status: about 77 bytes on disk and 140 bytes of memory per record for a
// short action id. Never a body, a header or a credential.
//
// A record that Reserve creates is on disk, synced, when Reserve returns;
// concurrent Reserves share one write and one sync (group commit). Updates
// are written lazily: with the next Reserve or Forget, within
// DefaultJournalFlushInterval, at Close, or at once with Sync; losing one to
// a crash costs one resend under the same key, which the server answers
// with a replay (the Transport Syncs the "done" of actions named by their
// fingerprint, where a lost one would matter).
//
// If a write or sync fails, the journal stops: every later call returns an
// error wrapping journal.ErrClosed and the cause (a failed sync may have
// lost data that no retry on the same file could confirm). Reopen it to
// recover from what is on disk.
//
// A FileJournal is safe for concurrent use. Only one FileJournal can be open
// on a directory at a time, in this process or any other: see
// ErrJournalLocked. Close it when done; the Transport closes the journal it
// opened itself.
type FileJournal struct {
	s        *engine.Store
	dir      string
	hashed   bool
	recovery JournalRecovery
}

var _ journal.Journal = (*FileJournal)(nil)

// ErrJournalRemoved: the file journal's directory (or its journal file) was
// removed, renamed or replaced while the journal was open. A record written
// from then on would vanish at the next start and its action could be sent
// under a second key, so the journal stops: Reserve (of a new action),
// Update, Sync and Close return an error wrapping journal.ErrClosed and
// ErrJournalRemoved. It is noticed at the next write (a Reserve that
// creates a record, a Forget, the lazy flush of updates within
// WithJournalFlushInterval), at Sync and at Close, by checking that the
// directory entry still names the open file. Nothing can undo the removal:
// the records it took are lost. Open a journal again to go on. (It joins the
// file journal's other errors, listed with journal.Journal.)
var ErrJournalRemoved = engine.ErrRemoved

// JournalRecovery says what OpenJournal found on disk and did about it.
type JournalRecovery struct {
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
	// copy is never left empty or partial, and pruning the copies to three
	// removes empty ones (left by older versions) before real ones.
	TornCopyErr error
	// Salvaged lists the damaged ranges that WithJournalSalvage skipped:
	// their records are lost. The damaged file was copied to CorruptCopy; a
	// salvage whose copy cannot be written fails and changes nothing.
	Salvaged    []*CorruptionError
	CorruptCopy string
	// ModeTightened lists the paths (the directory, the journal, LOCK)
	// whose permissions were wider than 0700 (directory) or 0600 (files)
	// and that OpenJournal narrowed to them, the process owning them.
	// ModeNotOwned lists those it left wider because another user owns
	// them. Both are empty on Windows.
	ModeTightened, ModeNotOwned []string
	// Duplicates counts exact copies of earlier frames found in the file (a
	// write repeated below the file system): they held nothing new and were
	// skipped, and the journal was rewritten without them.
	Duplicates int
	// AdoptedTemp: a compaction's (or the journal's creation's) complete
	// output had not been put in place, because of a crash before its
	// rename or a rename lost at a power loss (it may then hold later
	// records too); OpenJournal finished it. RemovedTemp: an incomplete or
	// superseded compaction output was removed.
	AdoptedTemp, RemovedTemp bool
	// Compacted: OpenJournal rewrote the journal without its dead records.
	Compacted bool
}

// OpenJournal opens the file journal in dir, creating the directory (mode
// 0700) and its files (mode 0600) if needed, and recovers it: a torn tail
// left by a crash is set aside and cut off (see FileJournal.Recovery). An
// existing directory, journal or LOCK file with wider permissions is
// narrowed to 0700 and 0600 when the process owns it, and listed in
// JournalRecovery.ModeNotOwned when another user does.
// The caller must Close the engine.
//
// Errors wrap ErrJournalLocked if another owner holds the directory (see
// WithJournalLockWait); a *CorruptionError (ErrJournalCorrupt) if
// acknowledged data is damaged, in which case nothing is changed on disk
// (see WithJournalSalvage); journal.ErrIncompatible for a journal of an
// unknown format version or the other WithHashedActionIDs setting; or the
// file system's error.
func OpenJournal(dir string, opts ...JournalOption) (*FileJournal, error) {
	c := defaultJournalConfig()
	for _, o := range opts {
		if o != nil { // as NewTransport does: a nil option is no option
			o(&c)
		}
	}
	s, rep, err := engine.Open(dir, engine.Options{
		Now:             c.now,
		Retention:       c.retention,
		MaxClockLead:    clockLead(c.retention),
		LockWait:        c.lockWait,
		HashedIDs:       c.hashed,
		Salvage:         c.salvage,
		FlushInterval:   c.flushEvery,
		CompactMinBytes: c.compactMin,
		ErrClosed:       journal.ErrClosed,
		ErrNotFound:     journal.ErrNotFound,
		Hooks:           c.hooks,
	})
	if err != nil {
		return nil, fmt.Errorf("idemretry: open journal %s: %w", dir, err)
	}
	return &FileJournal{s: s, dir: dir, hashed: c.hashed, recovery: JournalRecovery{
		Records:       rep.Records,
		TornTail:      rep.TornTail,
		TornOffset:    rep.TornOffset,
		TornBytes:     rep.TornBytes,
		TornCopy:      rep.TornCopy,
		TornCopyErr:   rep.TornCopyErr,
		Salvaged:      rep.Salvaged,
		CorruptCopy:   rep.CorruptCopy,
		AdoptedTemp:   rep.AdoptedTemp,
		RemovedTemp:   rep.RemovedTemp,
		Duplicates:    rep.Duplicates,
		ModeTightened: rep.ModeTightened,
		ModeNotOwned:  rep.ModeNotOwned,
		Compacted:     rep.Compacted,
	}}, nil
}

// Dir returns the journal's directory.
func (j *FileJournal) Dir() string { return j.dir }

// Recovery returns what OpenJournal found and did.
func (j *FileJournal) Recovery() JournalRecovery { return j.recovery }

const hashedPrefix = "sha256:"

// storedID is the id as the journal keys it. With WithHashedActionIDs it
// is the raw SHA-256 of the action id; an id already in the digest form
// that Unfinished returns ("sha256:" and 64 lowercase hex digits) is taken
// as that digest, so a listed action can be passed back to Reserve, Update
// and Forget and reaches the same record (as in sqljournal). Another id of
// that form would have to be a SHA-256 preimage, which nobody can make on
// purpose.
func (j *FileJournal) storedID(actionID string) string {
	if !j.hashed {
		return actionID
	}
	if sum, ok := digestOf(actionID); ok {
		return string(sum)
	}
	sum := sha256.Sum256([]byte(actionID))
	return string(sum[:])
}

// digestOf returns the digest of an id in the "sha256:<hex>" form that
// Unfinished returns with WithHashedActionIDs (lowercase hex only, as
// Unfinished writes it).
func digestOf(actionID string) ([]byte, bool) {
	h, ok := strings.CutPrefix(actionID, hashedPrefix)
	if !ok || len(h) != 2*sha256.Size {
		return nil, false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return nil, false
		}
	}
	sum, err := hex.DecodeString(h)
	return sum, err == nil
}

func toEntry(id string, rec journal.Record) (engine.Entry, error) {
	if rec.Attempts < 0 || int64(rec.Attempts) > math.MaxUint32 {
		return engine.Entry{}, fmt.Errorf("%w: attempts %d", journal.ErrInvalidRecord, rec.Attempts)
	}
	if rec.Status < 0 || rec.Status > math.MaxUint16 {
		return engine.Entry{}, fmt.Errorf("%w: status %d", journal.ErrInvalidRecord, rec.Status)
	}
	return engine.Entry{
		ID:          id,
		Key:         rec.Key,
		Fingerprint: rec.Fingerprint,
		CreatedMs:   rec.CreatedAt.UnixMilli(),
		State:       uint8(rec.State),
		Attempts:    uint32(rec.Attempts),
		Status:      uint16(rec.Status),
	}, nil
}

func fromEntry(actionID string, e engine.Entry) journal.Record {
	return journal.Record{
		ActionID:    actionID,
		Key:         e.Key,
		Fingerprint: e.Fingerprint,
		CreatedAt:   time.UnixMilli(e.CreatedMs),
		State:       journal.State(e.State),
		Attempts:    int(e.Attempts),
		Status:      int(e.Status),
	}
}

// Reserve implements journal.Journal. A record it creates is synced to disk before
// it returns; so is a returned record that another goroutine is still
// creating (Reserve waits for it). A journal.StateDone record whose retention is
// over, by the clock and by the time the journal has seen pass (see
// WithJournalRetention), counts as absent. CreatedAt is kept to
// the millisecond. If ctx ends while Reserve waits for the sync, it returns
// ctx's error; the record may still become durable, and a later Reserve
// returns it.
func (j *FileJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	e, err := toEntry(j.storedID(rec.ActionID), rec)
	if err != nil {
		return journal.Record{}, false, err
	}
	got, created, err := j.s.Reserve(ctx, e, mode == journal.ReusePending)
	if err != nil {
		return journal.Record{}, false, fmt.Errorf("idemretry: journal reserve %q: %w", rec.ActionID, err)
	}
	return fromEntry(rec.ActionID, got), created, nil
}

// Update implements journal.Journal. The change is written lazily (see FileJournal);
// Sync waits for it. It changes nothing and returns an error wrapping
// journal.ErrNotFound unless the action's record has rec.Key.
func (j *FileJournal) Update(ctx context.Context, rec journal.Record) error {
	e, err := toEntry(j.storedID(rec.ActionID), rec)
	if err != nil {
		return err
	}
	if err := j.s.Update(e.ID, e.Key, e.State, e.Attempts, e.Status); err != nil {
		return fmt.Errorf("idemretry: journal update %q: %w", rec.ActionID, err)
	}
	return nil
}

// Unfinished implements journal.Journal. With WithHashedActionIDs, each ActionID is
// "sha256:" and the hex digest of the original id.
func (j *FileJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	es, err := j.s.Unfinished()
	if err != nil {
		return nil, fmt.Errorf("idemretry: journal unfinished: %w", err)
	}
	out := make([]journal.Record, len(es))
	for i, e := range es {
		id := e.ID
		if j.hashed {
			id = hashedPrefix + hex.EncodeToString([]byte(e.ID))
		}
		out[i] = fromEntry(id, e)
	}
	return out, nil
}

// Forget implements Journal: it returns once the removal is synced. With
// WithHashedActionIDs it accepts the original id or the "sha256:..." form
// that Unfinished returns, as Reserve and Update do.
func (j *FileJournal) Forget(ctx context.Context, actionID string) error {
	ids := []string{j.storedID(actionID)}
	if _, ok := digestOf(actionID); ok && j.hashed {
		// Earlier versions hashed the digest form again in Reserve: forget
		// a record such a version may have stored under that id too.
		sum := sha256.Sum256([]byte(actionID))
		ids = append(ids, string(sum[:]))
	}
	for _, id := range ids {
		if err := j.s.Forget(ctx, id); err != nil {
			return fmt.Errorf("idemretry: journal forget %q: %w", actionID, err)
		}
	}
	return nil
}

// Sync waits until every Update made so far is on disk.
func (j *FileJournal) Sync(ctx context.Context) error {
	if err := j.s.Sync(ctx); err != nil {
		return fmt.Errorf("idemretry: journal sync: %w", err)
	}
	return nil
}

// Now returns the journal's time: the later of its clock (WithJournalClock)
// and the highest time it has seen, in the records it holds and in the
// clock high-water mark it persists with its writes. It never runs
// backwards, even across a reopen. A clock reading well behind it means the
// wall clock was set back (by NTP, or a user changing the phone's time):
// NewTransport logs that, since key windows are judged by the clock.
func (j *FileJournal) Now() time.Time { return j.s.Now() }

// Compact rewrites the journal now, without its forgotten and expired
// records (it also happens by itself when the file is mostly dead records,
// and at OpenJournal). Reserves wait while it runs.
func (j *FileJournal) Compact(ctx context.Context) error {
	if err := j.s.Compact(ctx); err != nil {
		return fmt.Errorf("idemretry: journal compact: %w", err)
	}
	return nil
}

// Close implements Journal: it writes and syncs pending updates, stops the
// journal's goroutine, closes its file and releases its lock. It returns the
// error of that last write, or the one that stopped the journal earlier.
// Calling it again returns nil.
func (j *FileJournal) Close() error {
	if err := j.s.Close(); err != nil {
		return fmt.Errorf("idemretry: journal close: %w", err)
	}
	return nil
}

// clockLead is how far ahead of the clock the journal believes its own
// high-water mark when expiring records: the part of the retention beyond
// the default key window, at most DefaultJournalGrace. Expiring that much
// early still keeps every done record for its whole key window; a journal
// kept for no longer than the window does not believe the mark at all.
func clockLead(retention time.Duration) time.Duration {
	return max(time.Millisecond, min(DefaultJournalGrace, retention-DefaultKeyWindow))
}
