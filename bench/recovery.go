package bench

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/internal/procstat"
	"github.com/idemretry/idemretry/journal"
)

// Cold recovery: how long filejournal.Open takes on a journal of a million
// live records, and how much it allocates on the way (goal 5 in README.md:
// at most 1.2 s, peak under 150 MB).

// RecoveryRecords is the size of the journal that goal 5 is about.
const RecoveryRecords = 1_000_000

// WriteRecoveryJournal creates, in dir, a file journal of n live records
// as idemretry leaves them after a crash mid-flight: pending, each with a
// WithAction-style id ("pay:" and a number), a UUID key, a SHA-256
// fingerprint and its creation time. It writes them through filejournal's
// public API, Reserve (durable, each record written and synced), from
// workers goroutines at once, whose Reserves the journal's group commit
// batches: the on-disk format is the journal's own, whatever it is, never
// imitated here. It closes the journal before it returns.
func WriteRecoveryJournal(dir string, n, workers int) error {
	j, err := filejournal.Open(dir)
	if err != nil {
		return err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	ctx := context.Background()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 12)) // keys need only be valid and distinct
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || errs[w] != nil {
					return
				}
				rec := journal.Record{ActionID: fmt.Sprintf("pay:%07d", i), Key: seededUUID(rng),
					CreatedAt: time.Now(), State: journal.StatePending}
				for k := 0; k < len(rec.Fingerprint); k += 8 {
					v := rng.Uint64()
					for b := range 8 {
						rec.Fingerprint[k+b] = byte(v >> (8 * b))
					}
				}
				if _, created, err := j.Reserve(ctx, rec, journal.ReuseAny); err != nil {
					errs[w] = err
				} else if !created {
					errs[w] = fmt.Errorf("record %s existed", rec.ActionID)
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			j.Close()
			return err
		}
	}
	return j.Close()
}

// seededUUID returns a random (version 4) UUID in its text form, from rng.
func seededUUID(rng *rand.Rand) string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rng.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// RecoveryResult is what one Open of a journal cost.
type RecoveryResult struct {
	Records   int           // live records Open loaded
	Compacted bool          // Open rewrote the journal
	FileBytes int64         // size of the journal's files
	Open      time.Duration // wall time of filejournal.Open
	// Allocated is every byte Open allocated (runtime.MemStats.TotalAlloc
	// before and after), garbage included.
	Allocated uint64
	// Peak is the most heap (live objects and garbage not yet swept:
	// runtime/metrics /memory/classes/heap/objects:bytes, which is
	// MemStats.HeapAlloc) seen during Open, above what the process held
	// before it, sampled every millisecond and at Open's return: a close
	// lower bound of the true peak.
	Peak uint64
	// Retained is what the open journal holds once garbage is collected.
	Retained uint64
}

// MeasureOpen opens the journal in dir once and measures it (see
// RecoveryResult), then closes it. Run it in a fresh process for a cold
// start: the heap before Open is then the process's own few hundred KB, and
// the garbage collector's pacing is what a restarting application sees.
func MeasureOpen(dir string) (RecoveryResult, error) {
	var res RecoveryResult
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() {
			res.FileBytes += fi.Size()
		}
	}
	runtime.GC()
	base := procstat.HeapObjects()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	stop := procstat.SampleHeapPeak(time.Millisecond)
	start := time.Now()
	j, err := filejournal.Open(dir)
	res.Open = time.Since(start)
	peak := stop()
	if err != nil {
		return res, err
	}
	runtime.ReadMemStats(&after)
	res.Allocated = after.TotalAlloc - before.TotalAlloc
	res.Peak = sub(peak, base)
	runtime.GC()
	res.Retained = sub(procstat.HeapObjects(), base)
	rec := j.Recovery()
	res.Records, res.Compacted = rec.Records, rec.Compacted
	return res, j.Close()
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
