package idemretry

import (
	engine "github.com/idemretry/idemretry/internal/journal"
	"github.com/idemretry/idemretry/journal"
)

// Errors of the file journal (OpenJournal, FileJournal), wrapped; test them
// with errors.Is.
var (
	// ErrJournalLocked: another owner, in this process or another one,
	// holds the journal directory's lock. OpenJournal returns it at once,
	// or after the wait set with WithJournalLockWait. A process that dies
	// releases its lock, however it dies.
	ErrJournalLocked = engine.ErrLocked
	// ErrJournalCorrupt: acknowledged data or the file header is damaged.
	// The error is a *CorruptionError naming the file and offset. Nothing
	// was changed on disk. Reopen with WithJournalSalvage to skip the
	// damaged frames (their records are lost and reported), or move the
	// directory away to start afresh.
	ErrJournalCorrupt = engine.ErrCorrupt
)

// CorruptionError describes damage found when opening a file journal: Path
// and Offset of the damaged range, its Length, the sequence numbers of the
// frames lost in it (FirstLostSeq, LastLostSeq; both 0 for a damaged file
// header) and a Reason. It matches ErrJournalCorrupt with errors.Is. It is
// returned by OpenJournal, and listed in JournalRecovery.Salvaged for
// ranges a salvage skipped.
type CorruptionError = engine.CorruptionError

// WithJournal makes the Transport keep keys in j instead of the default file
// journal. The caller keeps ownership: Transport.Close does not close j. A
// journal that expires records must keep done ones for at least the key
// window (see WithKeyWindow); the journals here keep them 48 hours by
// default. WithJournal and WithJournalDir exclude each other.
func WithJournal(j journal.Journal) Option { return func(c *config) { c.journal = j } }

// WithJournalDir opens the default file journal in dir instead of the
// per-user state directory (see DefaultJournalDir). Mobile apps pass their
// private files directory. The Transport owns the journal it opens and
// closes it in Transport.Close.
func WithJournalDir(dir string, opts ...JournalOption) Option {
	return func(c *config) { c.journalDir, c.journalOpts = dir, opts }
}
