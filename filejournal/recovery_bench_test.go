package filejournal

import (
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/procstat"
	"github.com/idemretry/idemretry/journal"
)

// BenchmarkColdRecovery1M measures Open of a journal of 1,000,000 live
// records (lock, read, verify every CRC, rebuild the index), the file in the
// page cache. The file is written once per run, before the measured opens.
// Besides ns/op and B/op (bytes allocated during Open), it reports:
//
//   - peak-heap-MB: the highest heap in use (runtime/metrics
//     /memory/classes/heap/objects:bytes: live objects and garbage not yet
//     swept) sampled every 200 µs during Open, above the heap before it;
//   - retained-MB: the heap that the open Journal holds after a GC (its
//     index), above the heap before Open;
//   - cpu-ms/op: the CPU time, user and system, that the process used
//     during Open (GC workers and the heap sampler included), which a busy
//     machine disturbs less than ns/op;
//   - file-MB: the journal's size.
func BenchmarkColdRecovery1M(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	writeRecoveryJournal(b, dir, n)
	fi, err := os.Stat(filepath.Join(dir, journalName))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("records=1M", func(b *testing.B) {
		benchOpen(b, dir, testOpts(), n)
		b.ReportMetric(float64(fi.Size())/1e6, "file-MB")
	})
}

// benchOpen measures Open of the journal in dir with o, which must load n
// records without a compaction or a torn tail, and reports cpu-ms/op,
// peak-heap-MB and retained-MB (see BenchmarkColdRecovery1M).
func benchOpen(b *testing.B, dir string, o config, n int) {
	b.ReportAllocs()
	var peak, retained uint64
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		base := procstat.HeapObjects()
		stop := procstat.SampleHeapPeak(200 * time.Microsecond)
		c0 := procstat.CPUTime()
		b.StartTimer()
		s, rep, err := openWith(dir, o)
		b.StopTimer()
		cpu += procstat.CPUTime() - c0
		p := stop()
		if err != nil {
			b.Fatal(err)
		}
		if rep.Records != n || rep.Compacted || rep.TornTail {
			b.Fatalf("records %d compacted %v torn %v", rep.Records, rep.Compacted, rep.TornTail)
		}
		runtime.GC()
		kept := procstat.HeapObjects()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		peak = max(peak, p-min(p, base))
		retained = max(retained, kept-min(kept, base))
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(peak)/1e6, "peak-heap-MB")
	b.ReportMetric(float64(retained)/1e6, "retained-MB")
}

// writeRecoveryJournal writes recoveryJournal(n) to dir's journal.
func writeRecoveryJournal(b testing.TB, dir string, n int) {
	b.Helper()
	if err := os.WriteFile(filepath.Join(dir, journalName), recoveryJournal(n), 0o600); err != nil {
		b.Fatal(err)
	}
}

// recoveryJournal returns a journal of n live records, written directly in
// frames of 64 records, as the group commits of a busy process leave it:
// ids "order-00000000" on, UUID keys, pending, created now, observed times
// about 10 ms apart. It is deterministic but for the creation time, and
// faster than Reserve by far.
func recoveryJournal(n int) []byte { return updatedJournal(n, 0) }

// updatedJournal is recoveryJournal(n) followed by every record updated
// times more (attempts 1, 2, ...), in frames of 64 operations.
func updatedJournal(n, times int) []byte {
	gen := uint32(12345)
	buf := header{gen: gen, flags: flagSeen, baseSeq: 1}.append(nil)
	seq := uint64(1)
	ops := make([]op, 0, 64)
	now := time.Now().UnixMilli()
	for round := 0; round <= times; round++ {
		for i := range n {
			id := "order-" + pad8(i)
			r := rec{id: id, created: now, state: journal.StatePending, seen: int64(i/64) * 10, attempts: uint32(round)}
			sum := sha256.Sum256(binary.LittleEndian.AppendUint64(nil, uint64(i)))
			copy(r.key[:], sum[:16])
			r.key[6] = r.key[6]&0x0f | 0x40
			r.key[8] = r.key[8]&0x3f | 0x80
			copy(r.fp[:], id)
			ops = append(ops, op{kind: opUpsert, r: r})
			if len(ops) == 64 {
				buf = appendFrame(buf, gen, seq, appendPayload(nil, ops))
				seq++
				ops = ops[:0]
			}
		}
	}
	if len(ops) > 0 {
		buf = appendFrame(buf, gen, seq, appendPayload(nil, ops))
	}
	return buf
}

func pad8(i int) string {
	s := strconv.Itoa(i)
	for len(s) < 8 {
		s = "0" + s
	}
	return s
}
