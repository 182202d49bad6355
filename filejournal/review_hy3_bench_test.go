package filejournal

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkHY3ColdRecoveryUpdated is BenchmarkColdRecovery1M for a journal
// of 1M records each updated twice (3M operations).
func BenchmarkHY3ColdRecoveryUpdated(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	data := updatedJournal(n, 2)
	if err := os.WriteFile(filepath.Join(dir, journalName), data, 0o600); err != nil {
		b.Fatal(err)
	}
	data = nil
	o := testOpts()
	o.compactMin = 1 << 40 // measure recovery, not a compaction
	benchOpen(b, dir, o, n)
}

// BenchmarkHY3CountLiveUpdated times countLive alone on the same journal.
func BenchmarkHY3CountLiveUpdated(b *testing.B) {
	src := memSource(updatedJournal(1_000_000, 2))
	b.ReportAllocs()
	for b.Loop() {
		if n := countLive(src); n < 999_000 {
			b.Fatal(n)
		}
	}
}

// BenchmarkHY3CountLiveSkew times countLive on 64 MB journals of deletes or
// updates of one id, and of deletes of distinct ids.
func BenchmarkHY3CountLiveSkew(b *testing.B) {
	for _, c := range []struct {
		name string
		mk   func(i int) op
	}{
		{"deletes-one-id", func(int) op { return op{kind: opDelete, r: rec{id: "x"}} }},
		{"deletes-distinct", func(i int) op {
			return op{kind: opDelete, r: rec{id: string([]byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)})}}
		}},
		{"upsert-delete-one-id", func(i int) op {
			if i%2 == 0 {
				return op{kind: opDelete, r: rec{id: "x"}}
			}
			r := rec{id: "x", state: 1, seen: 1}
			r.key[6], r.key[8] = 0x40, 0x80
			return op{kind: opUpsert, r: r}
		}},
	} {
		src := memSource(opsJournal(64<<20, c.mk))
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				countLive(src)
			}
		})
	}
}
