package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/idemretry/idemretry/bench"
)

// goal2Round is one round's figures at concurrency 1: the median wall time
// of an action of each participant (the probe's: of a sync), and the mean.
// Goal 2 is judged on the medians: a busy disk stalls a few syncs for
// milliseconds, which move a mean of a second's worth by more than the
// 30 µs the goal is about, and not the same way in the probe's slices as in
// the journal's.
type goal2Round struct {
	probe, net, file, unnamed time.Duration // medians
	// floor is the median of bench.ProbeThenNetHTTP: a sync, then a
	// net/http request, one after the other.
	floor time.Duration
	// handoff is the median of bench.ProbeHandoffThenNetHTTP: the same,
	// with the sync made on a goroutine of its own.
	handoff time.Duration
	mean    goal2Means
}

type goal2Means struct{ probe, net, file, unnamed time.Duration }

// goal2Slack is what goal 2 (bench/README.md) allows a named file-journal action
// over one probe sync plus net/http's request.
const goal2Slack = 30 * time.Microsecond

// bound is goal 2's bound on the file journal's time per named action.
func (g goal2Round) bound() time.Duration { return g.probe + g.net + goal2Slack }

// syncs is how many probe syncs' worth a file-journal action spends beyond
// net/http's request.
func (g goal2Round) syncs(t time.Duration) float64 { return div(float64(t-g.net), float64(g.probe)) }

// runE2E measures the end-to-end participants at each concurrency, each in
// its own bench.E2E (fresh journals), with the probe interleaved at
// concurrency 1; or the probe alone if e2e is not wanted.
func (res *results) runE2E(round int, d time.Duration, slices int, e2e, probe bool) error {
	fmt.Printf("\nround %d, e2e (1 KiB POST answered at once; actions/s; per participant %d interleaved slices of %v)\n",
		round, slices, d/time.Duration(slices))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	if e2e {
		printE2EHeader(w)
	}
	concs := bench.E2EConcurrency
	if !e2e {
		concs = []int{1}
	}
	var probeSample bench.Sample
	for _, conc := range concs {
		var names []string
		if e2e {
			names = append(names, bench.E2ENames...)
		}
		if probe && conc == 1 {
			names = append(names, bench.ProbeName)
			if e2e {
				names = append(names, bench.ProbeThenNetHTTP, bench.ProbeHandoffThenNetHTTP)
			}
		}
		e, err := bench.NewE2E(names)
		if err != nil {
			return err
		}
		got, err := e.Measure(conc, d, slices, round)
		if cerr := e.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if probe && conc == 1 {
			probeSample = got[bench.ProbeName]
			res.probe = append(res.probe, us(probeSample.P50()))
		}
		if !e2e {
			continue
		}
		if res.e2e[conc] == nil {
			res.e2e[conc], res.e2eRatio[conc] = map[string][]float64{}, map[string][]float64{}
			res.e2eCPU[conc], res.e2eUse[conc] = map[string][]float64{}, map[string][]float64{}
		}
		base := got[bench.NetHTTP].PerSecond()
		for _, name := range bench.E2ENames {
			rate := got[name].PerSecond()
			res.e2e[conc][name] = append(res.e2e[conc][name], rate)
			res.e2eRatio[conc][name] = append(res.e2eRatio[conc][name], div(rate, base))
			res.e2eCPU[conc][name] = append(res.e2eCPU[conc][name], us(got[name].CPUPerAction()))
			res.e2eUse[conc][name] = append(res.e2eUse[conc][name], got[name].CPUUse())
		}
		last := func(m map[string][]float64) func(string) float64 {
			return func(name string) float64 { return m[name][len(m[name])-1] }
		}
		printE2ERow(w, conc, last(res.e2e[conc]), last(res.e2eRatio[conc]))
		if conc == 1 && probe {
			res.goal2 = append(res.goal2, goal2Round{probe: probeSample.P50(),
				net: got[bench.NetHTTP].P50(), file: got[bench.IdemFile].P50(),
				unnamed: got[bench.E2EFileUnnamed].P50(), floor: got[bench.ProbeThenNetHTTP].P50(),
				handoff: got[bench.ProbeHandoffThenNetHTTP].P50(),
				mean: goal2Means{probe: probeSample.PerAction(), net: got[bench.NetHTTP].PerAction(),
					file: got[bench.IdemFile].PerAction(), unnamed: got[bench.E2EFileUnnamed].PerAction()}})
		}
	}
	w.Flush()
	if probe {
		fmt.Printf("probe (append %d B + fdatasync, same file system, interleaved at concurrency 1): %.0f/s; µs per sync: median %.0f, mean %.0f\n",
			bench.ProbeBytes, probeSample.PerSecond(), us(probeSample.P50()), us(probeSample.PerAction()))
	}
	if n := len(res.goal2); n > 0 && e2e && probe {
		g := res.goal2[n-1]
		fmt.Printf("concurrency 1, µs per action, median (mean): nethttp %.1f (%.1f), file named %.1f (%.1f), file unnamed %.1f (%.1f)\n",
			us(g.net), us(g.mean.net), us(g.file), us(g.mean.file), us(g.unnamed), us(g.mean.unnamed))
		fmt.Printf("  probe syncs' worth per action over nethttp (medians): file named %.2f, file unnamed %.2f\n",
			g.syncs(g.file), g.syncs(g.unnamed))
		fmt.Printf("  %s (a sync, then a request, one after the other): %.1f µs, %+.1f over probe + nethttp apart; file named %+.1f over it\n",
			bench.ProbeThenNetHTTP, us(g.floor), us(g.floor-g.probe-g.net), us(g.file-g.floor))
		fmt.Printf("  %s (the same, the sync made on a goroutine of its own): %.1f µs, %+.1f over %s; file named %+.1f over it\n",
			bench.ProbeHandoffThenNetHTTP, us(g.handoff), us(g.handoff-g.floor), bench.ProbeThenNetHTTP, us(g.file-g.handoff))
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// printE2EHeader prints the header of an e2e table: each participant's
// actions/s, and after each but net/http its ratio to net/http.
func printE2EHeader(w io.Writer) {
	fmt.Fprint(w, "conc\t")
	for _, name := range bench.E2ENames {
		fmt.Fprintf(w, "%s\t", name)
		if name != bench.NetHTTP {
			fmt.Fprint(w, "ratio\t")
		}
	}
	fmt.Fprintln(w)
}

// printE2ERow prints the row of an e2e table at conc, under printE2EHeader.
func printE2ERow(w io.Writer, conc int, rate, ratio func(name string) float64) {
	fmt.Fprintf(w, "%d\t", conc)
	for _, name := range bench.E2ENames {
		fmt.Fprintf(w, "%.0f\t", rate(name))
		if name != bench.NetHTTP {
			fmt.Fprintf(w, "%.3fx\t", ratio(name))
		}
	}
	fmt.Fprintln(w)
}

func (res *results) printE2EMedians() {
	if len(res.e2e) > 0 {
		fmt.Println("\ne2e: median actions/s and median ratio to nethttp in the same round")
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		printE2EHeader(w)
		for _, conc := range bench.E2EConcurrency {
			med := func(m map[string][]float64) func(string) float64 {
				return func(name string) float64 { return median(m[name]) }
			}
			printE2ERow(w, conc, med(res.e2e[conc]), med(res.e2eRatio[conc]))
		}
		w.Flush()
		fmt.Println("\ne2e CPU: median µs of the process's CPU per action (the server's included), and cores busy (CPU time per wall time)")
		w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(w, "conc\t")
		for _, name := range bench.E2ENames {
			fmt.Fprintf(w, "%s\tcores\t", name)
		}
		fmt.Fprintln(w)
		for _, conc := range bench.E2EConcurrency {
			fmt.Fprintf(w, "%d\t", conc)
			for _, name := range bench.E2ENames {
				fmt.Fprintf(w, "%.1f\t%.2f\t", median(res.e2eCPU[conc][name]), median(res.e2eUse[conc][name]))
			}
			fmt.Fprintln(w)
		}
		w.Flush()
	}
	if len(res.probe) > 0 {
		fmt.Printf("probe: %.0f µs per write+fdatasync of %d B (median over rounds of each round's median)\n", median(res.probe), bench.ProbeBytes)
	}
}

// fileVsMemory returns, per round, the file journal's (named) actions/s at
// conc over the memory journal's.
func (res *results) fileVsMemory(conc int, file string) []float64 {
	var q []float64
	f, m := res.e2e[conc][file], res.e2e[conc][bench.IdemMemory]
	for i := range min(len(f), len(m)) {
		q = append(q, div(f[i], m[i]))
	}
	return q
}
