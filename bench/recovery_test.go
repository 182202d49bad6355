package bench

import (
	"context"
	"testing"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// WriteRecoveryJournal writes the records it claims, as the journal reads
// them back: n pending records with distinct ids and keys; MeasureOpen
// opens all of them and measures something.
func TestRecoveryJournal(t *testing.T) {
	const n = 3000
	dir := t.TempDir()
	if err := WriteRecoveryJournal(dir, n, 16); err != nil {
		t.Fatal(err)
	}
	r, err := MeasureOpen(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Records != n || r.Open <= 0 || r.Allocated == 0 || r.Peak == 0 || r.FileBytes == 0 {
		t.Errorf("MeasureOpen: %+v", r)
	}
	j, err := filejournal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	recs, err := j.Unfinished(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids, keys := map[string]bool{}, map[string]bool{}
	for _, rec := range recs {
		if rec.State != journal.StatePending {
			t.Fatalf("record %+v not pending", rec)
		}
		ids[rec.ActionID], keys[rec.Key] = true, true
	}
	if len(recs) != n || len(ids) != n || len(keys) != n {
		t.Errorf("%d unfinished records, %d ids, %d keys; want %d", len(recs), len(ids), len(keys), n)
	}
}
