package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/idemretry/idemretry/bench"
)

// recoveryWriters is how many goroutines write the recovery journal: enough
// for the file journal's group commit to batch hundreds of records a sync.
const recoveryWriters = 256

// recoveryFixture is the journal the recovery case opens: written once per
// run, opened every round.
type recoveryFixture struct {
	base, dir string
	n         int
}

func newRecoveryFixture(n int) (*recoveryFixture, error) {
	base, err := os.MkdirTemp("", "idemretry-recovery-")
	if err != nil {
		return nil, err
	}
	f := &recoveryFixture{base: base, dir: filepath.Join(base, "journal"), n: n}
	start := time.Now()
	if err := bench.WriteRecoveryJournal(f.dir, n, recoveryWriters); err != nil {
		f.Close()
		return nil, err
	}
	fmt.Printf("recovery: wrote %d pending records with filejournal Reserve from %d goroutines in %.1f s, in %s\n",
		n, recoveryWriters, time.Since(start).Seconds(), f.dir)
	return f, nil
}

func (f *recoveryFixture) Close() error { return os.RemoveAll(f.base) }

// runRecovery opens the fixture in a fresh process twice: with the journal
// in the page cache (as after a process restart), then after asking the
// kernel to drop it (as after a machine restart), where it can.
func (res *results) runRecovery(round int, f *recoveryFixture) error {
	fmt.Printf("\nround %d, recovery (filejournal.Open of %d records in a fresh process)\n", round, f.n)
	warm, err := openInChild(f.dir)
	if err != nil {
		return err
	}
	res.recovery = append(res.recovery, warm)
	printRecovery("page cache warm", warm)
	dropped, err := bench.DropCache(f.dir)
	if err != nil {
		return err
	}
	if !dropped {
		return nil
	}
	cold, err := openInChild(f.dir)
	if err != nil {
		return err
	}
	res.cold = append(res.cold, cold)
	printRecovery("page cache dropped", cold)
	return nil
}

func printRecovery(what string, r bench.RecoveryResult) {
	fmt.Printf("%-18s  %.3f s  allocated %.1f MB  peak heap %.1f MB  retained %.1f MB  (%d records, file %.1f MB, compacted %v)\n",
		what, r.Open.Seconds(), mb(r.Allocated), mb(r.Peak), mb(r.Retained), r.Records, mb(uint64(r.FileBytes)), r.Compacted)
}

func mb(b uint64) float64 { return float64(b) / 1e6 }

// openInChild runs this command again with -recovery-open and reads back
// what bench.MeasureOpen measured there.
func openInChild(dir string) (bench.RecoveryResult, error) {
	var r bench.RecoveryResult
	exe, err := os.Executable()
	if err != nil {
		return r, err
	}
	cmd := exec.Command(exe, "-recovery-open", dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return r, fmt.Errorf("recovery child: %w", err)
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("recovery child said %q: %w", out, err)
	}
	return r, nil
}

// openChild is the child's side: one measured Open, printed as JSON.
func openChild(dir string) int {
	r, err := bench.MeasureOpen(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func (res *results) printRecoveryMedians() {
	for _, v := range []struct {
		what string
		rs   []bench.RecoveryResult
	}{{"page cache warm", res.recovery}, {"page cache dropped", res.cold}} {
		if len(v.rs) == 0 {
			continue
		}
		fmt.Printf("\nrecovery, %s: median over %d rounds\n", v.what, len(v.rs))
		printRecovery(v.what, medianRecovery(v.rs))
	}
}

// medianRecovery is the median of each figure separately.
func medianRecovery(rs []bench.RecoveryResult) bench.RecoveryResult {
	m := rs[len(rs)-1]
	m.Open = time.Duration(medianOf(rs, func(r bench.RecoveryResult) float64 { return float64(r.Open) }))
	m.Allocated = uint64(medianOf(rs, func(r bench.RecoveryResult) float64 { return float64(r.Allocated) }))
	m.Peak = uint64(medianOf(rs, func(r bench.RecoveryResult) float64 { return float64(r.Peak) }))
	m.Retained = uint64(medianOf(rs, func(r bench.RecoveryResult) float64 { return float64(r.Retained) }))
	return m
}
