package main

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemretry/idemretry"
)

// smallOverload is the payments scenario with flavour 4 alone at a tiny
// size, and the overload phase at a size and speed a test can afford.
func smallOverload() paymentsOptions {
	return paymentsOptions{clients: 4, intents: 2, scale: 10, strategies: "FullJitter", flavours: "4",
		overload: overloadOptions{clients: 2, intents: 40, outageScale: 40, herdClients: 6, herdRounds: 2, herdScale: 10}}
}

// The overload phase end to end: its three tables, every claim passing,
// both pictures and, with -csv, both CSV files.
func TestRunPaymentsOverloadSmall(t *testing.T) {
	out, dir, err := playPayments(t, smallOverload(), true)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	wantInOutput(t, out,
		"payments, outage: 2 app instances", "on (10, 0.1)", "With the budget:",
		"payments, load against failure rate", "brooker.co.za/blog/2022/02/28/retries.html",
		"payments, Retry-After herd: 6 clients", "old: max(drawn wait, Retry-After) (reproduced)", "new: Retry-After + drawn wait (the library's default)",
		"PASS  outage, budget on: server requests at most 1.1 x the first attempts",
		"PASS  outage, budget off: every payment made all 6 attempts inside the outage",
		"PASS  outage, budget on: every parked payment was resent after the outage and charged exactly once",
		"PASS  overload: every payment confirmed and charged exactly once",
		"PASS  load curve, budget on", "PASS  load curve, budget off",
		"PASS  Retry-After, the library's rule: no client came back before",
		"PASS  Retry-After: the library's rule spreads the herd",
	)
	// At a 100% failure rate every payment makes all 6 attempts, budget off:
	// expected and measured load are 6.00. A run the machine stalled is
	// marked " !" after the rate, which shifts the columns but not the figures.
	if !fullFailureRow.MatchString(out) {
		t.Errorf("output lacks the 100%% row with loads 6.00 and 6.00 (%v)", fullFailureRow)
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("a check failed")
	}
	for _, name := range []string{"payments_outage.png", "payments_load.png", "payments_overload.csv", "payments_retry_after.csv"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	rows := readCSV(t, filepath.Join(dir, "payments_overload.csv"))
	if len(rows) != 1+10 || rows[0][0] != "fail_rate" {
		t.Errorf("payments_overload.csv: %d rows, header %v", len(rows), rows[0])
	}
	if rows := readCSV(t, filepath.Join(dir, "payments_retry_after.csv")); len(rows) != 1+2*2 {
		t.Errorf("payments_retry_after.csv: %d rows", len(rows))
	}
	t.Logf("output:\n%s", out)
}

var fullFailureRow = regexp.MustCompile(`(?m)^\s*100%( !)?\s+6\.00\s+6\.00\s`)

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) == 0 {
		t.Fatalf("%s: %v", path, err)
	}
	return rows
}

// The budget's claims bite: every Transport of the overload phase without a
// budget (the runs labelled "on" included), and the scenario says FAIL and
// returns an error.
func TestRunPaymentsFailsWithoutBudget(t *testing.T) {
	opts := smallOverload()
	opts.overload.herdClients = 0
	opts.overload.loadOptions = []idemretry.Option{idemretry.WithRetryBudget(0, 0)}
	wantChecksFailed(t, opts,
		"FAIL  outage, budget on: server requests at most 1.1 x the first attempts",
		"FAIL  outage, budget on: every parked payment was resent",
		"FAIL  load curve, budget on",
		"PASS  overload: every payment confirmed and charged exactly once", // keys still work
		"SKIP  Retry-After",
	)
}
