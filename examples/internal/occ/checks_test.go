package occ

import (
	"strings"
	"testing"
)

// cellsOf builds a two-strategy-per-count table from (calls, time) pairs in
// the order of StrategyNames.
func cellsOf(n int, values ...[2]float64) []Cell {
	var cells []Cell
	for i, s := range StrategyNames() {
		cells = append(cells, Cell{Strategy: s, Clients: n, Runs: 1, Calls: values[i][0], Time: values[i][1]})
	}
	return cells
}

func TestShapeChecksReportTheTightestCase(t *testing.T) {
	// Decorr, EqualJitter, Exponential, FullJitter, None at N=100: the blog's
	// shape, except that Exponential makes fewer than twice FullJitter's calls.
	cells := cellsOf(100,
		[2]float64{1000, 4600}, [2]float64{812, 6700}, [2]float64{1500, 63000},
		[2]float64{796, 4900}, [2]float64{2400, 2000})
	checks := ShapeChecks(cells, Herd{})
	byClaim := map[string]Check{}
	for _, c := range checks {
		byClaim[c.Claim] = c
	}
	head := byClaim["FullJitter calls < 0.5 x Exponential at N=100"]
	if head.Status != Fail || !strings.Contains(head.Detail, "0.53") {
		t.Fatalf("headline: %+v", head)
	}
	if c := byClaim["EqualJitter time > 1.2 x FullJitter time"]; c.Status != Pass || !strings.Contains(c.Detail, "1.37 at N=100") {
		t.Fatalf("equal vs full time: %+v", c)
	}
	if !Failed(checks) {
		t.Fatal("Failed missed the failing claim")
	}
	for _, c := range checks {
		if strings.HasPrefix(c.Claim, "N=190") && c.Status != Skip {
			t.Fatalf("herd check without a herd: %+v", c)
		}
	}
}

func TestShapeChecksSkipMissingCounts(t *testing.T) {
	cells := cellsOf(10,
		[2]float64{37, 433}, [2]float64{42, 722}, [2]float64{50, 3449},
		[2]float64{39, 467}, [2]float64{51, 380})
	for _, c := range ShapeChecks(cells, Herd{}) {
		wantSkip := strings.Contains(c.Claim, "N=100") || strings.Contains(c.Claim, "N>=") ||
			strings.HasPrefix(c.Claim, "N=190")
		if wantSkip != (c.Status == Skip) || c.Status == Fail {
			t.Errorf("%s: %s (%s)", c.Claim, c.Status, c.Detail)
		}
	}
}
