package main

import (
	"fmt"
	"io"

	"github.com/idemretry/idemretry/examples/internal/occ"
)

// occOrder is the order strategies are shown in: from no backoff, through
// plain exponential, to the jittered ones, as the blog tells it.
var occOrder = []string{"None", "Exponential", "EqualJitter", "FullJitter", "Decorr"}

// occMetric is one of the two things the sweep measures.
type occMetric struct {
	title  string
	value  func(occ.Cell) float64
	format string
	tol    float64 // how far from the reference a cell may be
}

var (
	occCalls = occMetric{"Calls: writes that reached the server per run, mean (less is less work)",
		func(c occ.Cell) float64 { return c.Calls }, "%.1f", occ.CallsTolerance}
	occTime = occMetric{"Completion time: ms until the last client's write succeeded, mean",
		func(c occ.Cell) float64 { return c.Time }, "%.0f", occ.TimeTolerance}
)

// printOccTable prints one metric of the sweep, a row per client count.
// Under each client count the reference has, it adds the reference's value
// and the ratio ours/reference, with "!" where the ratio is outside the
// tolerance, so every cell can be checked by eye.
func printOccTable(w io.Writer, m occMetric, cells, ref []occ.Cell) {
	metric, format, tol := m.value, m.format, m.tol
	fmt.Fprintf(w, "%s\n", m.title)
	fmt.Fprintf(w, "%4s %6s", "N", "runs")
	for _, s := range occOrder {
		fmt.Fprintf(w, " %12s", s)
	}
	fmt.Fprintln(w)
	for _, n := range clientsOf(cells) {
		first, _ := occ.Find(cells, occOrder[0], n)
		fmt.Fprintf(w, "%4d %6d", n, first.Runs)
		for _, s := range occOrder {
			c, _ := occ.Find(cells, s, n)
			fmt.Fprintf(w, " %12s", fmt.Sprintf(format, metric(c)))
		}
		fmt.Fprintln(w)
		if _, ok := occ.Find(ref, occOrder[0], n); !ok {
			continue
		}
		fmt.Fprintf(w, "%4s %6s", "", "ref")
		for _, s := range occOrder {
			r, _ := occ.Find(ref, s, n)
			fmt.Fprintf(w, " %12s", fmt.Sprintf(format, metric(r)))
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "%4s %6s", "", "ratio")
		for _, s := range occOrder {
			c, _ := occ.Find(cells, s, n)
			r, _ := occ.Find(ref, s, n)
			ratio := metric(c) / metric(r)
			mark := " "
			if ratio < 1-tol || ratio > 1+tol {
				mark = "!"
			}
			fmt.Fprintf(w, " %12s", fmt.Sprintf("%.3f%s", ratio, mark))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// printChecks prints each of the blog's claims with its outcome and numbers.
// Below 200 runs a cell's noise can flip the tightest claims, so it says so.
func printChecks(w io.Writer, checks []occ.Check, cells []occ.Cell) {
	fmt.Fprintln(w, "The blog's claims, checked on this sweep:")
	for _, c := range checks {
		fmt.Fprintf(w, "  %s  %s\n        %s\n", c.Status, c.Claim, c.Detail)
	}
	fewest := cells[0].Runs
	for _, c := range cells {
		fewest = min(fewest, c.Runs)
	}
	if fewest < 200 && occ.Failed(checks) {
		fmt.Fprintf(w, "  (only %d runs in some cells: sampling noise can flip the tightest claims,\n", fewest)
		fmt.Fprintln(w, "  such as Exponential's calls, 1.5% under None's at N=20; run more with -runs)")
	}
	fmt.Fprintln(w)
}

// printOccMeaning says in plain words what the tables show, with the
// numbers of the sweep at 100 clients (or the largest count it has).
func printOccMeaning(w io.Writer, cells []occ.Cell) {
	ns := clientsOf(cells)
	n := ns[len(ns)-1]
	for _, m := range ns {
		if m == 100 {
			n = m
		}
	}
	get := func(s string) occ.Cell { c, _ := occ.Find(cells, s, n); return c }
	none, expo, full := get("None"), get("Exponential"), get("FullJitter")
	fmt.Fprintln(w, "What it means:")
	fmt.Fprintf(w, "  - Jitter cuts the work by more than half: at %d clients full jitter made %.0f\n", n, full.Calls)
	fmt.Fprintf(w, "    calls where plain exponential backoff made %.0f (%.2fx).\n", expo.Calls, full.Calls/expo.Calls)
	fmt.Fprintf(w, "  - Retrying at once is the fastest but the costliest: %.0f ms, against %.0f ms\n", none.Time, full.Time)
	fmt.Fprintf(w, "    for full jitter, but %.0f calls (%.1fx). Jitter buys less work, not less time.\n",
		none.Calls, none.Calls/full.Calls)
	fmt.Fprintf(w, "  - Plain exponential backoff is the worst of both: clients that fail together\n")
	fmt.Fprintf(w, "    retry together, so it took %.0f ms (%.0fx full jitter) and still made %.1fx its calls.\n",
		expo.Time, expo.Time/full.Time, expo.Calls/full.Calls)
}

// clientsOf returns the client counts of cells in order of appearance.
func clientsOf(cells []occ.Cell) []int {
	var ns []int
	for _, c := range cells {
		if len(ns) == 0 || ns[len(ns)-1] != c.Clients {
			ns = append(ns, c.Clients)
		}
	}
	return ns
}
