package filejournal

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/datasync"
	"github.com/idemretry/idemretry/internal/procstat"
	"github.com/idemretry/idemretry/journal"
)

// The benchmarks report ratios to raw probes measured in the same run,
// because this machine's disk drifts several-fold from minute to minute
// : "raw" is a plain write plus fdatasync (datasync) of the
// same number of bytes, in the same directory.

func benchEntry(i int) journal.Record {
	e := journal.Record{ActionID: fmt.Sprintf("order-%08d", i), Key: newKey(), CreatedAt: time.UnixMilli(time.Now().UnixMilli()), State: journal.StatePending}
	copy(e.Fingerprint[:], e.ActionID)
	return e
}

func frameSizeOf(e journal.Record) int {
	o := op{kind: opUpsert, r: toRec(e.ActionID, e)}
	return frameHeaderSize + len(appendPayload(nil, []op{o}))
}

func p50(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkDurableCreate: one writer, Reserve of a new action (write +
// fdatasync of one frame) against two raw probes of the same size,
// interleaved so that all three see the same disk: write+fdatasync inline in
// the caller's goroutine ("raw"), and the same handed to another goroutine
// and back ("raw-handoff"), which is the floor for any design with a
// committer goroutine: after a blocking syscall, waking a parked goroutine
// costs Go's scheduler some tens of µs on a 2-core VM.
func BenchmarkDurableCreate(b *testing.B) {
	s, rawWrite := openWithRawProbe(b)
	rawOp := func() {
		if err := rawWrite(); err != nil {
			b.Error(err)
		}
	}
	req, resp := make(chan struct{}), make(chan struct{})
	go func() {
		for range req {
			rawOp()
			resp <- struct{}{}
		}
	}()
	defer close(req)
	var jl, rl, hl []time.Duration
	ctx := context.Background()
	i := 0
	for b.Loop() {
		t0 := time.Now()
		rawOp()
		t1 := time.Now()
		req <- struct{}{}
		<-resp
		t2 := time.Now()
		if _, _, err := s.Reserve(ctx, benchEntry(i), journal.ReuseAny); err != nil {
			b.Fatal(err)
		}
		jl = append(jl, time.Since(t2))
		rl, hl = append(rl, t1.Sub(t0)), append(hl, t2.Sub(t1))
		i++
	}
	j, r, h := p50(jl), p50(rl), p50(hl)
	b.ReportMetric(float64(j.Microseconds()), "p50-µs")
	b.ReportMetric(float64(r.Microseconds()), "raw-p50-µs")
	b.ReportMetric(float64(h.Microseconds()), "raw-handoff-p50-µs")
	b.ReportMetric(float64((j - r).Microseconds()), "over-raw-µs")
	b.ReportMetric(float64((j - h).Microseconds()), "over-handoff-µs")
	b.ReportMetric(float64(j)/float64(r), "x-raw")
}

// rawCommitter is the natural-batching probe: callers append a record-sized
// buffer and wait; one goroutine writes everything pending, syncs, and
// wakes them.
type rawCommitter struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pending []byte
	gen     uint64 // batches taken
	synced  uint64 // batches synced
	f       *os.File
	stop    bool
}

func newRawCommitter(f *os.File) *rawCommitter {
	c := &rawCommitter{f: f}
	c.cond = sync.NewCond(&c.mu)
	go c.run()
	return c
}

func (c *rawCommitter) run() {
	c.mu.Lock()
	for {
		for len(c.pending) == 0 && !c.stop {
			c.cond.Wait()
		}
		if c.stop {
			c.mu.Unlock()
			return
		}
		buf := c.pending
		c.pending = nil
		c.gen++
		c.mu.Unlock()
		_, _ = c.f.Write(buf)
		_ = datasync.File(c.f)
		c.mu.Lock()
		c.synced++
		c.cond.Broadcast()
	}
}

func (c *rawCommitter) add(rec []byte) {
	c.mu.Lock()
	c.pending = append(c.pending, rec...)
	want := c.gen + 1
	c.cond.Broadcast()
	for c.synced < want {
		c.cond.Wait()
	}
	c.mu.Unlock()
}

func (c *rawCommitter) close() {
	c.mu.Lock()
	c.stop = true
	c.cond.Broadcast()
	c.mu.Unlock()
}

// BenchmarkGroupCommit: N concurrent creators, records per second through
// the journal against the raw natural-batching probe.
func BenchmarkGroupCommit(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64, 256} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			s, _, rc := openBenchRaw(b)
			rec := make([]byte, frameSizeOf(benchEntry(0))-frameHeaderSize)
			// Enough operations per phase for a stable rate.
			ops := max(b.N, 4*n, 200)
			run := func(do func(i int)) time.Duration { return runSpread(n, ops, do) }
			ctx := context.Background()
			// Entries are made before the clock starts: minting ids and
			// random keys is the caller's cost, not the journal's.
			entries := make([]journal.Record, 2*ops+1)
			for i := range entries {
				entries[i] = benchEntry(i)
			}
			b.ResetTimer()
			var rawT, jT time.Duration
			// Alternate halves, so that a change of the disk's mood hits
			// both sides.
			base := 0
			for range 2 {
				rawT += run(func(int) { rc.add(rec) })
				jT += run(func(i int) {
					if _, _, err := s.Reserve(ctx, entries[base+i], journal.ReuseAny); err != nil {
						b.Error(err)
					}
				})
				base += ops
			}
			rawRate := float64(2*ops) / rawT.Seconds()
			jRate := float64(2*ops) / jT.Seconds()
			b.ReportMetric(jRate, "recs/s")
			b.ReportMetric(rawRate, "raw-recs/s")
			b.ReportMetric(jRate/rawRate, "x-raw")
		})
	}
}

// writeBigJournal writes a journal of n records directly, in frames of 64
// records, as group commits of a busy process would leave it.
func writeBigJournal(b *testing.B, dir string, n int) {
	gen := uint32(12345)
	buf := header{gen: gen, flags: formatFlags, baseSeq: 1}.append(nil)
	seq := uint64(1)
	ops := make([]op, 0, 64)
	for i := 0; i < n; i++ {
		e := benchEntry(i)
		r := toRec(e.ActionID, e)
		r.seen = int64(i/64) * 10 // about 10 ms apart
		ops = append(ops, op{kind: opUpsert, r: r})
		if len(ops) == 64 || i == n-1 {
			buf = appendFrame(buf, gen, seq, appendPayload(nil, ops))
			seq++
			ops = ops[:0]
		}
	}
	if err := os.WriteFile(filepath.Join(dir, journalName), buf, 0o600); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRecovery: Open (lock, read, verify every CRC, rebuild the
// index) of journals of 10k, 100k and 1M live records, file in page cache.
func BenchmarkRecovery(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			writeBigJournal(b, dir, n)
			fi, _ := os.Stat(filepath.Join(dir, journalName))
			for b.Loop() {
				s, rep, err := openWith(dir, testOpts())
				if err != nil {
					b.Fatal(err)
				}
				if rep.Records != n || rep.Compacted {
					b.Fatalf("records %d compacted %v", rep.Records, rep.Compacted)
				}
				_ = s.Close()
			}
			b.ReportMetric(float64(fi.Size())/float64(n), "file-B/rec")
		})
	}
}

var keep *Journal

// BenchmarkMemoryPerEntry: heap held by an open journal of 100k records,
// per record (index, ids, everything).
func BenchmarkMemoryPerEntry(b *testing.B) {
	const n = 100_000
	dir := b.TempDir()
	writeBigJournal(b, dir, n)
	var per float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s, _, err := openWith(dir, testOpts())
		if err != nil {
			b.Fatal(err)
		}
		keep = s
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / n
		_ = s.Close()
		keep = nil
	}
	b.ReportMetric(per, "B/entry")
}

// BenchmarkPresentCheck: the check that the directory entry still names the
// open journal file (one stat of the path; see present), made once per
// group-commit batch, against the raw write+fdatasync of one frame that each
// batch costs at least.
func BenchmarkPresentCheck(b *testing.B) {
	s, rawWrite := openWithRawProbe(b)
	var rawT, checkT time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := rawWrite(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		s.identMu.Lock()
		err := s.present()
		s.identMu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
		checkT += time.Since(t1)
		rawT += t1.Sub(t0)
	}
	b.ReportMetric(float64(checkT.Nanoseconds())/float64(b.N), "check-ns")
	b.ReportMetric(float64(checkT)/float64(rawT), "x-raw")
}

// openWithRawProbe opens a journal in a new directory and, beside it, a raw
// file; rawWrite appends one frame's worth of bytes to that file and
// fdatasyncs it, the floor a journal write is measured against. Both are
// closed when the benchmark ends.
func openWithRawProbe(b *testing.B) (s *Journal, rawWrite func() error) {
	dir := b.TempDir()
	s, _ = mustOpen(b, dir, testOpts())
	b.Cleanup(func() { s.Close() })
	raw, err := os.OpenFile(filepath.Join(dir, "raw"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { raw.Close() })
	buf := make([]byte, frameSizeOf(benchEntry(0)))
	return s, func() error {
		if _, err := raw.Write(buf); err != nil {
			return err
		}
		return datasync.File(raw)
	}
}

// BenchmarkReserveDurable: the Transport's journal calls for one new
// action, at concurrency 1, 16 and 64: a named action is Reserve then its
// lazy "done" Update; an unnamed one (named by its fingerprint) also Syncs
// that done before returning. Against, in the same run and alternately, the
// raw natural-batching probe (rawCommitter: write+fdatasync of everything
// pending, by one goroutine) with one record-sized append per action, and
// at concurrency 1 also the inline raw write+fdatasync of one frame. The
// ratios are the journal's actions/s over the probe's; at concurrency 1, the
// p50 time of an action over one raw sync (two for an unnamed action).
func BenchmarkReserveDurable(b *testing.B) {
	for _, kind := range []string{"named", "unnamed"} {
		for _, n := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/c=%d", kind, n), func(b *testing.B) {
				benchReserveDurable(b, n, kind == "unnamed")
			})
		}
	}
}

func benchReserveDurable(b *testing.B, n int, unnamed bool) {
	s, f, rc := openBenchRaw(b)
	rec := make([]byte, frameSizeOf(benchEntry(0))-frameHeaderSize)
	frame := make([]byte, frameSizeOf(benchEntry(0)))
	ops := max(b.N, 4*n, 200)
	run := func(do func(i int)) time.Duration { return runSpread(n, ops, do) }
	ctx := context.Background()
	const rounds = 4
	entries := make([]journal.Record, rounds*ops+1)
	for i := range entries {
		entries[i] = benchEntry(i)
	}
	action := func(e journal.Record) { benchAction(ctx, b, s, e, unnamed) }
	b.ResetTimer()
	if n == 1 {
		// One action, then one inline raw write+fdatasync of a frame, in
		// turn, each timed: the disk drifts too much for phases.
		var jl, rl []time.Duration
		for i := range ops {
			t0 := time.Now()
			action(entries[i])
			t1 := time.Now()
			if _, err := f.Write(frame); err != nil {
				b.Fatal(err)
			}
			if err := datasync.File(f); err != nil {
				b.Fatal(err)
			}
			jl, rl = append(jl, t1.Sub(t0)), append(rl, time.Since(t1))
		}
		j, r := float64(p50(jl).Nanoseconds())/1e3, float64(p50(rl).Nanoseconds())/1e3
		syncs := 1.0
		if unnamed {
			syncs = 2
		}
		b.ReportMetric(j, "p50-µs/action")
		b.ReportMetric(r, "raw-sync-p50-µs")
		b.ReportMetric(j-syncs*r, "over-raw-µs")
		return
	}
	var rawT, jT []time.Duration
	base := 0
	for range rounds {
		rawT = append(rawT, run(func(int) { rc.add(rec) }))
		bs := base
		jT = append(jT, run(func(i int) { action(entries[bs+i]) }))
		base += ops
	}
	perNs := func(d []time.Duration) float64 { return float64(p50(d).Nanoseconds()) / float64(ops) / 1e3 }
	j, r := perNs(jT), perNs(rawT)
	b.ReportMetric(j, "µs/action")
	b.ReportMetric(1e6/j, "actions/s")
	b.ReportMetric(r, "raw-batch-µs/rec")
	b.ReportMetric(r/j, "x-raw-batch")
}

// nosyncFile is a journal file whose Sync does nothing: with it a benchmark
// measures the journal's own cost, without the disk's.
type nosyncFile struct{ file }

func (nosyncFile) Sync() error { return nil }

// BenchmarkOverheadNoSync: the journal's own time per new action at
// concurrency 1 (Reserve then the lazy done Update, and for an unnamed
// action a Sync), with a file whose Sync does nothing: handoffs to the
// committer and back, encoding, the write syscall, the presence check.
func BenchmarkOverheadNoSync(b *testing.B) {
	for _, unnamed := range []bool{false, true} {
		name := "named"
		if unnamed {
			name = "unnamed"
		}
		for _, n := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/c=%d", name, n), func(b *testing.B) {
				o := testOpts()
				o.hooks = &hooks{wrapFile: func(_ string, f file) file { return nosyncFile{f} }}
				s, _ := mustOpen(b, b.TempDir(), o)
				defer s.Close()
				ctx := context.Background()
				entries := make([]journal.Record, b.N)
				for i := range entries {
					entries[i] = benchEntry(i)
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.ResetTimer()
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := int(next.Add(1)) - 1
							if i >= b.N {
								return
							}
							if !benchAction(ctx, b, s, entries[i], unnamed) {
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

// runSpread calls do(1) .. do(ops), spread over n goroutines, and returns
// the time they took.
func runSpread(n, ops int, do func(i int)) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > ops {
					return
				}
				do(i)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// benchAction journals one action: Reserve, then its final Update, then,
// with syncAfter, a Sync. It reports false if the Reserve failed.
func benchAction(ctx context.Context, b *testing.B, s *Journal, e journal.Record, syncAfter bool) bool {
	if _, _, err := s.Reserve(ctx, e, journal.ReuseAny); err != nil {
		b.Error(err)
		return false
	}
	e.State, e.Status = journal.StateDone, 200
	if err := s.Update(ctx, e); err != nil {
		b.Error(err)
	}
	if syncAfter {
		if err := s.Sync(ctx); err != nil {
			b.Error(err)
		}
	}
	return true
}

// openBenchRaw opens a journal in a new directory and, beside it, the raw
// probe's file "raw" with its committer; all are closed when b ends,
// the committer first and the journal last.
func openBenchRaw(b *testing.B) (*Journal, *os.File, *rawCommitter) {
	dir := b.TempDir()
	s, _ := mustOpen(b, dir, testOpts())
	b.Cleanup(func() { _ = s.Close() })
	f, err := os.OpenFile(filepath.Join(dir, "raw"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	rc := newRawCommitter(f)
	b.Cleanup(rc.close)
	return s, f, rc
}

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
	buf := header{gen: gen, flags: formatFlags, baseSeq: 1}.append(nil)
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

// BenchmarkColdRecoveryUpdated is BenchmarkColdRecovery1M for a journal
// of 1M records each updated twice (3M operations).
func BenchmarkColdRecoveryUpdated(b *testing.B) {
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

// BenchmarkCountLiveUpdated times countLive alone on the same journal.
func BenchmarkCountLiveUpdated(b *testing.B) {
	src := memSource(updatedJournal(1_000_000, 2))
	b.ReportAllocs()
	for b.Loop() {
		if n := countLive(src); n < 999_000 {
			b.Fatal(n)
		}
	}
}

// BenchmarkCountLiveSkew times countLive on 64 MB journals of deletes or
// updates of one id, and of deletes of distinct ids.
func BenchmarkCountLiveSkew(b *testing.B) {
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
