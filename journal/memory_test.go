package journal_test

import (
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/journal/journaltest"
)

func TestMemoryConformance(t *testing.T) {
	journaltest.Run(t, func(*testing.T) journal.Journal { return journal.NewMemory() },
		journaltest.Corrupt(func(_ *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error) {
			journal.StoreUnchecked(j.(*journal.Memory), rec)
			return j, nil
		}))
}

// A nil *Memory (a typed nil given to WithJournal) has no fingerprint
// secret, and asking does not panic: NewTransport asks every journal.
func TestNilMemoryHasNoFingerprintSecret(t *testing.T) {
	var m *journal.Memory
	_, ok := m.FingerprintSecret(m)
	if ok {
		t.Fatal("a nil Memory gave a fingerprint secret")
	}
}
