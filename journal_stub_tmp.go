package idemretry

// TEMPORARY: replaced by the file journal (issue 3). Do not build on it.

import "errors"

// JournalOption configures OpenJournal.
type JournalOption func(*journalConfig)

type journalConfig struct{}

// FileJournal is the file-backed Journal.
type FileJournal struct{ MemoryJournal }

// OpenJournal opens the file journal in dir.
func OpenJournal(dir string, opts ...JournalOption) (*FileJournal, error) {
	return nil, errors.New("idemretry: file journal not implemented yet")
}

// DefaultJournalDir returns the per-user state directory for this program.
func DefaultJournalDir() (string, error) { return "", errors.New("not implemented") }
