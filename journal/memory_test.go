package journal_test

import (
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/journal/journaltest"
)

func TestMemoryConformance(t *testing.T) {
	journaltest.Run(t, func(*testing.T) journal.Journal { return journal.NewMemory() })
}
