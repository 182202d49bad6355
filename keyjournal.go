package idemretry

// How the Transport uses its journal: the one WithJournal gives it, or the
// default file journal (package filejournal) that NewTransport opens, owns
// and closes.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// WithJournal makes the Transport keep keys in j instead of the default file
// journal. The caller keeps ownership: Transport.Close does not close j. A
// journal that expires records must keep done ones for at least the key
// window (see WithKeyWindow); the journals here keep them 48 hours by
// default (journal.DefaultRetention). A Transport has one journal:
// WithJournal(nil) (a nil interface or a nil pointer), a second
// WithJournal, or WithJournal with WithJournalDir fails NewTransport with
// ErrInvalidOption.
func WithJournal(j journal.Journal) Option {
	return func(c *config) { c.journal, c.journalBy = j, append(c.journalBy, "WithJournal") }
}

// WithJournalDir opens the default file journal in dir instead of the
// per-user state directory (see filejournal.DefaultDir), with the options
// given (filejournal.WithLockWait, say). Mobile apps pass their private
// files directory. The Transport owns the journal it opens and closes it in
// Transport.Close.
//
// dir must be an absolute path: a relative one would put the keys of
// unfinished payments wherever the process was started. An empty or
// relative dir, or a second WithJournalDir or WithJournal, fails
// NewTransport with ErrInvalidOption; leave the option out to use the
// default directory.
func WithJournalDir(dir string, opts ...filejournal.Option) Option {
	return func(c *config) {
		c.journalDir, c.journalOpts, c.journalBy = dir, opts, append(c.journalBy, "WithJournalDir")
	}
}

// openJournal opens the file journal the Transport owns: in the directory
// WithJournalDir gave, or filejournal.DefaultDir. The journal is told the
// key window, so that done records outlive it whatever its length (or a
// repeat within the window would get a new key), and the Transport's clock,
// so that expiry reads the same clock as the window; the options given to
// WithJournalDir come after, and win. Opening fails with an error wrapping
// filejournal.ErrLocked if another Transport or process holds the journal;
// a bad option fails with ErrInvalidOption (and filejournal.ErrInvalidOption).
func (t *Transport) openJournal() error {
	dir := t.cfg.journalDir
	if dir == "" {
		var err error
		if dir, err = filejournal.DefaultDir(); err != nil {
			return err
		}
	}
	opts := append([]filejournal.Option{
		filejournal.WithKeyWindow(t.cfg.keyWindow),
		filejournal.WithClock(t.cfg.clock.Now),
	}, t.cfg.journalOpts...)
	j, err := filejournal.Open(dir, opts...)
	if errors.Is(err, filejournal.ErrInvalidOption) {
		return &journalOptionError{err}
	}
	if err != nil {
		return err
	}
	t.journal, t.ownsJournal = j, true
	// An app that never calls Close (or drops the Transport) would leave the
	// journal's flusher running and its lock held for the life of the
	// process: once the Transport is unreachable, the journal is closed.
	// Its lazy updates reach the disk within filejournal's flush interval
	// (DefaultFlushInterval, 1 s) in any case.
	handedOut := t.journalHandedOut
	runtime.AddCleanup(t, func(j *filejournal.Journal) {
		if !handedOut.Load() {
			_ = j.Close()
		}
	}, j)
	t.logRecovery(j)
	return nil
}

// journalOptionError is a bad file journal option given to WithJournalDir:
// a bad option of NewTransport too.
type journalOptionError struct{ err error }

func (e *journalOptionError) Error() string   { return e.err.Error() }
func (e *journalOptionError) Unwrap() []error { return []error{ErrInvalidOption, e.err} }

// logRecovery reports at Warn what opening the journal found damaged or
// changed: a torn tail (a crash mid-write; a damaged last frame looks the
// same), ranges a salvage skipped, frames written twice, permissions it
// could not narrow, a fingerprint secret it could not read or make, or made
// for a journal that holds records.
func (t *Transport) logRecovery(j *filejournal.Journal) {
	r := j.Recovery()
	if t.cfg.logger == nil {
		return
	}
	ctx := context.Background()
	if r.TornTail || len(r.Salvaged) > 0 || r.Duplicates > 0 {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: journal recovered from damage",
			slog.String("dir", j.Dir()), slog.Bool("torn_tail", r.TornTail), slog.Int64("torn_offset", r.TornOffset),
			slog.Int64("torn_bytes", r.TornBytes), slog.String("torn_copy", r.TornCopy), slog.Any("torn_copy_error", r.TornCopyErr),
			slog.Int("salvaged_ranges", len(r.Salvaged)), slog.String("corrupt_copy", r.CorruptCopy),
			slog.Int("duplicate_frames", r.Duplicates))
	}
	if len(r.ModeNotOwned) > 0 {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: journal files owned by another user are readable by others",
			slog.String("dir", j.Dir()), slog.Any("paths", r.ModeNotOwned))
	}
	if r.FingerprintSecretErr != nil {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: journal has no fingerprint secret: named bodies of 512 bytes or more get SHA-256 "+
			"fingerprints, and actions recorded with keyed ones are refused (nothing sent) until their key windows end",
			slog.String("dir", j.Dir()), slog.Any("error", r.FingerprintSecretErr))
	}
	if r.FingerprintSecretMade && r.Records > 0 {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: made a fingerprint secret for a journal that holds records "+
			"(expected once after an upgrade from a release without keyed fingerprints): if its fingerprint.key was deleted, "+
			"actions recorded with keyed fingerprints are refused (nothing sent) until their key windows end",
			slog.String("dir", j.Dir()), slog.Int("records", r.Records))
	}
}

// checkReserved returns err, or, when err is nil, an error wrapping
// journal.ErrCorruptRecord if rec, a record the journal's Reserve
// returned, is one that journal.CheckRecord refuses. The journals of this
// module check what they read back, but a journal of someone else's may
// return what its storage holds as it is: an empty key would go out as no
// Idempotency-Key at all, attempts at their bound could never be recorded.
// Nothing of such an action is sent.
func checkReserved(rec journal.Record, err error) error {
	if err != nil {
		return err
	}
	return journal.CheckStored(rec)
}

// keyless returns an error wrapping ErrInvalidKey if req's method is keyed
// and key is empty: such a request is never sent (without a key, each
// retry could be performed as a new action).
func (t *Transport) keyless(req *http.Request, key string) error {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if key == "" && t.cfg.keyed[method] {
		return fmt.Errorf("%w: a %s request without a key", ErrInvalidKey, method)
	}
	return nil
}
