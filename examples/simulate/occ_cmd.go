package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemretry/idemretry/examples/internal/occ"
)

// errChecksFailed reports that the occ scenario ran but the blog's shape did
// not hold; the details are already printed.
var errChecksFailed = errors.New("occ: a shape check failed (see FAIL above)")

// occOptions are the occ scenario's flags.
type occOptions struct {
	runs    int
	clients string
	csv     bool
}

func occFlags(fs *flag.FlagSet) *occOptions {
	o := &occOptions{}
	fs.IntVar(&o.runs, "runs", 0, "occ: runs per (strategy, clients) cell; 0 means 4000 at N<=20, 1000 at N=50,100,150,190, 400 elsewhere (about 20 s on 2 cores)")
	fs.StringVar(&o.clients, "clients", "", "occ: comma-separated client counts to run (default 10,20,...,190)")
	fs.BoolVar(&o.csv, "csv", false, "also write CSV files: occ's means to <out>/occ.csv in the reference's CSV format; payments' overload runs to <out>/payments_overload.csv and its Retry-After herds to <out>/payments_retry_after.csv")
	return o
}

// runOcc runs the OCC contention sweep, prints it against the reference,
// checks the blog's shape and draws the curves.
func runOcc(ctx context.Context, c common, o *occOptions) error {
	clients, err := parseClients(o.clients)
	if err != nil {
		return err
	}
	if o.runs < 0 {
		return fmt.Errorf("occ: -runs %d is negative", o.runs)
	}
	runs := occ.DefaultRuns
	if o.runs > 0 {
		runs = func(int) int { return o.runs }
	}
	ref, err := occReference()
	if err != nil {
		return err
	}

	plan := occ.Plan{Seed: c.Seed, Clients: clients, Runs: runs}
	fmt.Fprintln(c.Stdout, "occ: N clients race to update one row, each failed write backing off with")
	fmt.Fprintln(c.Stdout, "idemretry's own backoff types (the AWS Architecture Blog's \"Exponential")
	fmt.Fprintln(c.Stdout, "Backoff And Jitter\" model, on a virtual clock: nothing sleeps).")
	fmt.Fprintf(c.Stdout, "runs per cell: %s; seed %d; %d workers\n\n", describeRuns(clients, runs), c.Seed, runtime.GOMAXPROCS(0))

	start := time.Now()
	bar := newProgress(c, "occ", plan.TotalWork(), "running the sweep...")
	plan.Progress = bar.add
	cells, err := occ.Sweep(ctx, plan)
	var herd occ.Herd
	if err == nil && slices.Contains(clients, occ.HerdClients) {
		herd = occ.HerdRun(c.Seed, "Exponential", "EqualJitter", "FullJitter")
	}
	bar.finish(time.Since(start), err)
	if err != nil {
		return fmt.Errorf("occ: %w", err)
	}

	checks := append(occ.ShapeChecks(cells, herd), referenceCheck(occ.Compare(cells, ref)))
	printOccTable(c.Stdout, occCalls, cells, ref)
	printOccTable(c.Stdout, occTime, cells, ref)
	printChecks(c.Stdout, checks, cells)
	printOccMeaning(c.Stdout, cells)

	if err := writeOccFiles(c, o, cells, ref, herd); err != nil {
		return err
	}
	if occ.Failed(checks) {
		return errChecksFailed
	}
	return nil
}

// parseClients reads -clients; empty means the blog's whole sweep.
func parseClients(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return occ.SweepClients(), nil
	}
	var ns []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("occ: -clients: %q is not a positive number", f)
		}
		if !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	return ns, nil
}

// describeRuns says how many runs each cell got, most first, grouping the
// client counts that got the same: "4000 at N=10,20; 1000 at N=50,100;
// 400 at the other N".
func describeRuns(clients []int, runs func(int) int) string {
	groups := map[int][]string{}
	var order []int
	for _, n := range clients {
		r := runs(n)
		if _, ok := groups[r]; !ok {
			order = append(order, r)
		}
		groups[r] = append(groups[r], strconv.Itoa(n))
	}
	if len(order) == 1 {
		return strconv.Itoa(order[0])
	}
	slices.SortFunc(order, func(a, b int) int { return b - a })
	var parts []string
	for i, r := range order {
		at := "N=" + strings.Join(groups[r], ",")
		if i == len(order)-1 && len(groups[r]) > 5 {
			at = "the other N"
		}
		parts = append(parts, fmt.Sprintf("%d at %s", r, at))
	}
	return strings.Join(parts, "; ")
}

// referenceCheck turns the cell-by-cell comparison into one check. Below
// 200 runs a cell's own noise can exceed the tolerances, so it is skipped.
func referenceCheck(ds []occ.Deviation) occ.Check {
	claim := fmt.Sprintf("every reference cell within %.0f%% on calls, %.0f%% on time",
		100*occ.CallsTolerance, 100*occ.TimeTolerance)
	if len(ds) == 0 {
		return occ.Check{Claim: claim, Status: occ.Skip, Detail: "no reference client count in this sweep"}
	}
	worstCalls, worstTime, bad := 0.0, 0.0, 0
	for _, d := range ds {
		if d.Got.Runs < 200 {
			return occ.Check{Claim: claim, Status: occ.Skip, Detail: "needs at least 200 runs per cell"}
		}
		worstCalls = max(worstCalls, abs(d.CallsRatio-1))
		worstTime = max(worstTime, abs(d.TimeRatio-1))
		if !d.CallsOK() || !d.TimeOK() {
			bad++
		}
	}
	status := occ.Pass
	if bad > 0 {
		status = occ.Fail
	}
	return occ.Check{Claim: claim, Status: status, Detail: fmt.Sprintf(
		"%d of %d cells out; farthest %.1f%% on calls, %.1f%% on time",
		bad, len(ds), 100*worstCalls, 100*worstTime)}
}

func abs(x float64) float64 { return max(x, -x) }

// writeOccFiles draws the plots and, with -csv, writes the means.
func writeOccFiles(c common, o *occOptions, cells, ref []occ.Cell, herd occ.Herd) error {
	if err := os.MkdirAll(c.OutDir, 0o755); err != nil {
		return fmt.Errorf("occ: %w", err)
	}
	var written []string
	curves := filepath.Join(c.OutDir, "occ.png")
	if err := plotOccCurves(curves, cells, ref); err != nil {
		return fmt.Errorf("occ: plot: %w", err)
	}
	written = append(written, curves)
	if herd.Counts != nil {
		path := filepath.Join(c.OutDir, "occ_herd.png")
		if err := plotOccHerd(path, herd); err != nil {
			return fmt.Errorf("occ: plot: %w", err)
		}
		written = append(written, path)
	}
	if o.csv {
		path := filepath.Join(c.OutDir, "occ.csv")
		if err := writeOccCSV(path, cells); err != nil {
			return fmt.Errorf("occ: %w", err)
		}
		written = append(written, path)
	}
	fmt.Fprintf(c.Stdout, "\nwrote %s\n", strings.Join(written, ", "))
	return nil
}

func writeOccCSV(path string, cells []occ.Cell) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := occ.WriteCSV(f, cells); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
