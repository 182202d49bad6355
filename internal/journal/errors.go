package journal

import (
	"errors"
	"fmt"

	"github.com/idemretry/idemretry/internal/lockfile"
	seam "github.com/idemretry/idemretry/journal"
)

// Sentinel errors, wrapped by the errors Open and the Store return.
var (
	// ErrLocked: another owner holds the journal directory's lock.
	ErrLocked = lockfile.ErrLocked
	// ErrCorrupt: acknowledged data or the file header is damaged. The
	// error is a *CorruptionError naming the file and offset.
	ErrCorrupt = errors.New("idemretry: journal corrupt")
	// ErrIncompatible: the file was written by an unknown major version of
	// the format, or with other options (hashed action ids or not).
	ErrIncompatible = seam.ErrIncompatible
	// ErrRemoved: the journal file the Store writes is no longer the one its
	// directory names: the directory (or the file) was removed, renamed or
	// replaced while the journal was open. What it acknowledged from then
	// on would be lost, so the Store stops; errors wrap it with the closed
	// sentinel.
	ErrRemoved = errors.New("idemretry: journal removed or replaced on disk")
	// ErrInvalidRecord: a record cannot be stored (empty or over-long
	// action id, invalid key, out-of-range field).
	ErrInvalidRecord = seam.ErrInvalidRecord
)

// CorruptionError describes damage to acknowledged data or to a file
// header. It matches ErrCorrupt with errors.Is.
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
}

func (e *CorruptionError) Error() string {
	if e.FirstLostSeq == 0 {
		return fmt.Sprintf("idemretry: journal corrupt: %s at offset %d: %s", e.Path, e.Offset, e.Reason)
	}
	return fmt.Sprintf("idemretry: journal corrupt: %s at offset %d (%d bytes, frames %d-%d): %s",
		e.Path, e.Offset, e.Length, e.FirstLostSeq, e.LastLostSeq, e.Reason)
}

// Is reports whether target is ErrCorrupt.
func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }
