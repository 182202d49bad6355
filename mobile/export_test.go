package idemretry

// JournalFailure is journalFailure, for errors_test.go: the failure of a
// journal call named what.
func JournalFailure(err error, what string) error { return journalFailure(err, what) }
