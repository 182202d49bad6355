package filejournal

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idemretry/idemretry/journal"
)

// Errors of the file journal, wrapped; test them with errors.Is. It returns
// the journal package's sentinels too: journal.ErrUnavailable (a write or
// sync failed, a full disk say: nothing was stored, try again later),
// journal.ErrClosed (closed, or stopped because the journal was removed:
// reopen it), journal.ErrNotFound (Update of a record that is not there), journal.ErrInvalidRecord and journal.ErrIncompatible (a file
// of an unknown or earlier format version, or written with the other
// WithHashedIDs setting).
var (
	// ErrLocked: another Journal, in this process or another one, holds the
	// directory's lock. Open returns it at once, or after the wait set with
	// WithLockWait. A process that dies releases its lock, however it dies.
	ErrLocked = errors.New("idemretry: journal locked")
	// ErrCorrupt: acknowledged data or the file header is damaged. The
	// error is a *CorruptionError naming the file and offset. Nothing was
	// changed on disk. Reopen with WithSalvage to skip the damaged frames
	// (their records are lost and reported), or move the directory away to
	// start afresh.
	ErrCorrupt = errors.New("idemretry: journal corrupt")
	// ErrRemoved: the journal's directory (or its journal file) was
	// removed, renamed or replaced while the journal was open. A record
	// written from then on would vanish at the next start and its action
	// could be sent under a second key, so the journal stops: Reserve (of a
	// new action), Update, Sync and Close return an error wrapping
	// journal.ErrClosed and ErrRemoved. It is noticed at the next write (a
	// Reserve that creates a record, a Forget, the lazy flush of updates
	// within the flush interval), at Sync and at Close, by checking that the
	// directory entry still names the open file. Nothing can undo the
	// removal: the records it took are lost. Open a journal again to go on.
	ErrRemoved = errors.New("idemretry: journal removed or replaced on disk")
	// ErrInvalidOption: Open was given an option with a value out of its
	// range (a negative wait, a key window that is not positive, ...), or
	// an empty directory.
	ErrInvalidOption = errors.New("idemretry: invalid file journal option")
)

// CorruptionError describes damage to acknowledged data or to a file
// header, found by Open: the Path and Offset of the damaged range, its
// Length, the sequence numbers of the frames lost in it, and a Reason. It
// matches ErrCorrupt (and journal.ErrCorruptRecord) with errors.Is. Open
// returns it, and
// Recovery.Salvaged lists the ranges a salvage skipped.
type CorruptionError struct {
	// Path of the damaged file.
	Path string
	// Offset of the first damaged byte range (the start of the bad frame,
	// or 0 for a bad header).
	Offset int64
	// Length of the damaged range that a salvage skips, in bytes (0 when
	// unknown, as for a bad header).
	Length int64
	// FirstLostSeq and LastLostSeq bound the sequence numbers of the frames
	// lost in the range (both 0 for a bad header, and for bytes that are no
	// frame found before an intact next frame: nothing was lost).
	FirstLostSeq, LastLostSeq uint64
	// Reason says what was wrong, for people.
	Reason string
	// Actions are the ids of the actions whose records the damaged range
	// held, each once, as Unfinished reports ids (the digest form with
	// WithHashedIDs), as far as its bytes can be read: with a checksum
	// that fails, any of them may be damaged too, and a range whose frame
	// lengths are damaged names none. A salvage reports the ones whose
	// records it may have lost in Journal.Unfinished.
	Actions []string
	// upserts are the upserts read from the damaged range (see
	// lostActions).
	upserts []damagedUpsert
}

func (e *CorruptionError) Error() string {
	var msg string
	if e.FirstLostSeq == 0 {
		msg = fmt.Sprintf("idemretry: journal corrupt: %s at offset %d: %s", e.Path, e.Offset, e.Reason)
	} else {
		msg = fmt.Sprintf("idemretry: journal corrupt: %s at offset %d (%d bytes, frames %d-%d): %s",
			e.Path, e.Offset, e.Length, e.FirstLostSeq, e.LastLostSeq, e.Reason)
	}
	return msg + namedActions(e.Actions)
}

// maxNamedActions is how many of its Actions a CorruptionError's message
// names; it counts the others.
const maxNamedActions = 3

// namedActions says actions for a message ("", or "; actions "a", "b" and
// 2 more"), each quoted: a damaged id may hold any byte.
func namedActions(actions []string) string {
	if len(actions) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("; action")
	if len(actions) > 1 {
		b.WriteByte('s')
	}
	for i, a := range actions[:min(len(actions), maxNamedActions)] {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %q", a)
	}
	if n := len(actions) - maxNamedActions; n > 0 {
		fmt.Fprintf(&b, " and %d more", n)
	}
	return b.String()
}

// Is reports whether target is ErrCorrupt or journal.ErrCorruptRecord: a
// damaged frame's records are damaged.
func (e *CorruptionError) Is(target error) bool {
	return target == ErrCorrupt || target == journal.ErrCorruptRecord
}

// lockedError is ErrLocked with the directory, and the holder's process id
// when its lock file says (0 if not).
type lockedError struct {
	dir string
	pid int
}

func (e *lockedError) Error() string {
	holder := "another Client or process"
	switch {
	case e.pid > 0 && e.pid == os.Getpid():
		holder = fmt.Sprintf("another Client of this process (pid %d)", e.pid)
	case e.pid > 0:
		holder = fmt.Sprintf("another Client or process (pid %d)", e.pid)
	}
	return fmt.Sprintf("idemretry: journal locked: %s is held by %s; one Client per directory: close it, "+
		"use another directory, or wait with idemretry.WithJournalDir(dir, filejournal.WithLockWait(d))", e.dir, holder)
}

func (e *lockedError) Is(target error) bool { return target == ErrLocked }

// removedError is ErrRemoved with the path.
type removedError struct{ path string }

func (e *removedError) Error() string {
	return fmt.Sprintf("journal %s removed or replaced on disk while open", e.path)
}

func (e *removedError) Is(target error) bool { return target == ErrRemoved }

// opError is an error of one of the journal's operations: "idemretry:
// journal <op>: <err>", with the "idemretry: " of err dropped so that the
// prefix appears once.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "idemretry: journal " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "idemretry: ")
}

func (e *opError) Unwrap() error { return e.err }

// wrap returns err as an error of op, or nil.
func wrap(err error, op string, args ...any) error {
	if err == nil {
		return nil
	}
	if len(args) > 0 {
		op = fmt.Sprintf(op, args...)
	}
	return &opError{op: op, err: err}
}

// lostError is the error of an action whose record a salvage lost with a
// damaged range (see Journal.Unfinished): it matches ErrCorrupt and
// journal.ErrCorruptRecord, as the *CorruptionError it wraps does.
type lostError struct {
	action string
	ce     *CorruptionError
}

func (e *lostError) Error() string {
	return fmt.Sprintf("%v: action %q: its record was lost with the damaged range that salvage skipped (%s)",
		journal.ErrCorruptRecord, e.action, strings.TrimPrefix(e.ce.Error(), "idemretry: "))
}

func (e *lostError) Unwrap() error { return e.ce }
