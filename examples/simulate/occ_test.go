package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/examples/internal/occ"
)

// testRuns is how many runs each reference cell gets in the test: enough
// that the simulation's own noise stays several standard errors inside the
// tolerances whatever the seed. N = 10 gets the most because its completion
// time varies the most (Exponential: sd 38% of the mean) and its runs are
// nearly free; the big counts vary less than 15% and cost the most.
func testRuns(n int) int {
	switch {
	case n <= 10:
		return 4000
	case n <= 50:
		return 1000
	default:
		return 400
	}
}

// TestOccReproducesReference is the scenario's acceptance test: every cell
// of the blog's own simulator within 3% on calls and 5% on time, and the
// blog's shape. It runs under -race too, so the model must stay fast.
func TestOccReproducesReference(t *testing.T) {
	if testing.Short() {
		t.Skip("about 5 s (60 s with -race); CI runs it")
	}
	ref, err := occReference()
	if err != nil {
		t.Fatal(err)
	}
	const seed = 20150304 // any seed must do; this one is the blog's date
	cells, err := occ.Sweep(context.Background(), occ.Plan{Seed: seed, Clients: occ.ReferenceClients(), Runs: testRuns})
	if err != nil {
		t.Fatal(err)
	}
	ds := occ.Compare(cells, ref)
	if len(ds) != len(ref) {
		t.Fatalf("compared %d cells, the reference has %d", len(ds), len(ref))
	}
	for _, d := range ds {
		if !d.CallsOK() || !d.TimeOK() {
			t.Errorf("%s N=%d (%d runs): calls %.2f vs %.2f (x%.3f), time %.1f vs %.1f (x%.3f)",
				d.Ref.Strategy, d.Ref.Clients, d.Got.Runs, d.Got.Calls, d.Ref.Calls, d.CallsRatio,
				d.Got.Time, d.Ref.Time, d.TimeRatio)
		}
	}
	herd := occ.HerdRun(seed, "Exponential", "FullJitter")
	for _, c := range occ.ShapeChecks(cells, herd) {
		if c.Status != occ.Pass {
			t.Errorf("%s %s: %s", c.Status, c.Claim, c.Detail)
		}
	}
}

// The reference itself must pass the shape checks it is the source of:
// otherwise a check is wrong, not the model.
func TestReferenceHasTheBlogsShape(t *testing.T) {
	ref, err := occReference()
	if err != nil {
		t.Fatal(err)
	}
	if len(ref) != 25 {
		t.Fatalf("reference has %d cells, want 25", len(ref))
	}
	for _, c := range occ.ShapeChecks(ref, occ.Herd{}) {
		if c.Status == occ.Fail {
			t.Errorf("reference fails %q: %s", c.Claim, c.Detail)
		}
	}
}

// The command end to end on a small sweep: tables, checks, files, and a
// CSV in the reference's format.
func TestRunOccWritesTablesAndFiles(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	c := common{Seed: 3, OutDir: dir, Stdout: &out, Stderr: &errOut}
	err := runOcc(context.Background(), c, &occOptions{runs: 30, clients: "190, 10,100", csv: true})
	if err != nil {
		t.Fatalf("runOcc: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		"runs per cell: 30",
		"Calls: writes that reached the server",
		"Completion time:",
		"ref",
		"ratio",
		"PASS  FullJitter calls < 0.5 x Exponential at N=100",
		"SKIP  every reference cell",
		"What it means:",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, name := range []string{"occ.png", "occ_herd.png"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	f, err := os.Open(filepath.Join(dir, "occ.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cells, err := occ.ReadCSV(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 15 || cells[0].Clients != 10 || cells[0].Strategy != "Decorr" || cells[0].Runs != 30 {
		t.Fatalf("CSV cells: %+v", cells)
	}
}

// Same seed, same output, to the byte.
func TestRunOccIsDeterministic(t *testing.T) {
	run := func() string {
		var out bytes.Buffer
		c := common{Seed: 9, OutDir: t.TempDir(), Stdout: &out, Stderr: &bytes.Buffer{}}
		// So few runs may fail a tight claim; that is not what is tested.
		err := runOcc(context.Background(), c, &occOptions{runs: 20, clients: "10,40"})
		if err != nil && !errors.Is(err, errChecksFailed) {
			t.Fatal(err)
		}
		// The file list names the temporary directory; the rest must match.
		return strings.Split(out.String(), "\nwrote ")[0]
	}
	if a, b := run(), run(); a != b {
		t.Fatalf("two runs with seed 9 differ:\n%s\n---\n%s", a, b)
	}
}

func TestParseClients(t *testing.T) {
	ns, err := parseClients(" 30,10,30 ")
	if err != nil || len(ns) != 2 || ns[0] != 10 || ns[1] != 30 {
		t.Fatalf("parseClients: %v, %v", ns, err)
	}
	if all, _ := parseClients(""); len(all) != 19 || all[18] != 190 {
		t.Fatalf("default clients: %v", all)
	}
	for _, bad := range []string{"0", "ten", "10,,20", "-5"} {
		if _, err := parseClients(bad); err == nil {
			t.Errorf("parseClients(%q) accepted", bad)
		}
	}
}

func TestDescribeRuns(t *testing.T) {
	got := describeRuns(occ.SweepClients(), func(n int) int {
		switch n {
		case 10, 20:
			return 4000
		case 50, 100:
			return 1000
		}
		return 400
	})
	if want := "4000 at N=10,20; 1000 at N=50,100; 400 at the other N"; got != want {
		t.Fatalf("describeRuns = %q, want %q", got, want)
	}
	if got := describeRuns([]int{10, 20}, func(int) int { return 7 }); got != "7" {
		t.Fatalf("one group: %q", got)
	}
}
