package occ

import (
	"fmt"
	"math"
	"slices"
)

// Status is a shape check's outcome.
type Status string

const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP" // the sweep did not include the client counts it needs
)

// A Check is one qualitative claim of the blog, tested on a sweep.
type Check struct {
	Claim  string
	Status Status
	Detail string // the numbers behind the status
}

// jittered are the strategies that draw their waits at random.
var jittered = []string{"Decorr", "EqualJitter", "FullJitter"}

// ShapeChecks tests the blog's shape on cells, each claim at
// every client count the sweep has, and the herd's empty bins. A claim is
// reported with its tightest case, so a PASS shows its margin.
func ShapeChecks(cells []Cell, herd Herd) []Check {
	clients := clientCounts(cells)
	calls := func(s string, n int) float64 { c, _ := Find(cells, s, n); return c.Calls }
	time := func(s string, n int) float64 { c, _ := Find(cells, s, n); return c.Time }

	var checks []Check

	// The blog's headline.
	if slices.Contains(clients, 100) {
		r := calls("FullJitter", 100) / calls("Exponential", 100)
		checks = append(checks, check(r < 0.5, "FullJitter calls < 0.5 x Exponential at N=100",
			"FullJitter %.0f = %.2f x Exponential %.0f", calls("FullJitter", 100), r, calls("Exponential", 100)))
	} else {
		checks = append(checks, skip("FullJitter calls < 0.5 x Exponential at N=100"))
	}

	// of is the ratio of metric m for strategies a and b at n clients.
	of := func(m func(string, int) float64, a, b string) func(n int) float64 {
		return func(n int) float64 { return m(a, n) / m(b, n) }
	}
	checks = append(checks,
		worst(clients, 20, "Exponential calls < None calls for N>=20",
			of(calls, "Exponential", "None"), below, 1, "Exponential/None = %.3f at N=%d"),
		worst(clients, 0, "EqualJitter and FullJitter calls within 10%",
			func(n int) float64 {
				a, b := calls("EqualJitter", n), calls("FullJitter", n)
				return 100 * (math.Max(a, b)/math.Min(a, b) - 1)
			}, below, 10, "widest gap %.1f%% at N=%d"),
		worst(clients, 30, "Decorr calls > FullJitter calls for N>=30",
			of(calls, "Decorr", "FullJitter"), above, 1, "Decorr/FullJitter = %.2f at N=%d"),
		worst(clients, 0, "Exponential time > 4 x slowest jittered time",
			func(n int) float64 {
				slowest := 0.0
				for _, s := range jittered {
					slowest = math.Max(slowest, time(s, n))
				}
				return time("Exponential", n) / slowest
			}, above, 4, "Exponential/slowest jittered = %.1f at N=%d"),
		worst(clients, 0, "EqualJitter time > 1.2 x FullJitter time",
			of(time, "EqualJitter", "FullJitter"), above, 1.2, "EqualJitter/FullJitter = %.2f at N=%d"),
		worst(clients, 0, "None (retry at once) has the lowest completion time",
			func(n int) float64 {
				fastest := math.Inf(1)
				for _, s := range StrategyNames() {
					if s != "None" {
						fastest = math.Min(fastest, time(s, n))
					}
				}
				return time("None", n) / fastest
			}, below, 1, "None/fastest other = %.2f at N=%d"),
	)

	expo, bins := herd.Empty("Exponential")
	full, _ := herd.Empty("FullJitter")
	claim := fmt.Sprintf("N=%d, %.0f-%.0f ms: Exponential leaves most 10 ms bins empty, FullJitter none",
		HerdClients, HerdFrom, HerdTo)
	if herd.Counts == nil {
		checks = append(checks, skip(claim))
	} else {
		checks = append(checks, check(bins > 0 && 2*expo > bins && full == 0, claim,
			"empty of %d bins (%d runs pooled): Exponential %d, FullJitter %d", bins, HerdRuns, expo, full))
	}
	return checks
}

// Failed reports whether any check failed.
func Failed(checks []Check) bool {
	return slices.ContainsFunc(checks, func(c Check) bool { return c.Status == Fail })
}

// bound says which way a claim about a ratio goes.
type bound int

const (
	below bound = iota // the ratio must stay under the limit at every N
	above              // the ratio must stay over the limit at every N
)

// worst evaluates ratio at every client count >= from and checks the
// value nearest to failing against limit. format gets that value and its N.
func worst(clients []int, from int, claim string, ratio func(n int) float64,
	dir bound, limit float64, format string) Check {
	at, value := 0, 0.0
	for _, n := range clients {
		if n < from {
			continue
		}
		r := ratio(n)
		if at == 0 || (dir == above && r < value) || (dir == below && r > value) {
			at, value = n, r
		}
	}
	if at == 0 {
		return skip(claim)
	}
	ok := value < limit
	if dir == above {
		ok = value > limit
	}
	return check(ok, claim, format, value, at)
}

func check(ok bool, claim, format string, args ...any) Check {
	s := Fail
	if ok {
		s = Pass
	}
	return Check{Claim: claim, Status: s, Detail: fmt.Sprintf(format, args...)}
}

func skip(claim string) Check {
	return Check{Claim: claim, Status: Skip, Detail: "client counts not in this sweep"}
}

// clientCounts returns the distinct client counts of cells, ascending.
func clientCounts(cells []Cell) []int {
	var ns []int
	for _, c := range cells {
		if !slices.Contains(ns, c.Clients) {
			ns = append(ns, c.Clients)
		}
	}
	slices.Sort(ns)
	return ns
}
