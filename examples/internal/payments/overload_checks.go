package payments

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/idemretry/idemretry"
)

// LoadTolerance is how far a budget-less run's requests per payment may
// be from ExpectedLoad: the failures are drawn at random, so a run of 800
// payments lands within a few percent of it.
const LoadTolerance = 0.10

// BudgetBound is the most requests the default retry budget lets a run
// make: every first attempt, plus DefaultBudgetRatio of a retry for each,
// plus the DefaultBudgetTokens each Transport's bucket starts with.
func BudgetBound(firstAttempts, transports int) int {
	return int(math.Floor((1+idemretry.DefaultBudgetRatio)*float64(firstAttempts))) + idemretry.DefaultBudgetTokens*transports
}

// OverloadChecks tests the overload phase's claims on its runs (the load
// curve, whose 100 % runs are the outage) and on the Retry-After herds.
func OverloadChecks(runs []*LoadResult, herds []*HerdResult) []Check {
	var outageOn, outageOff, curveOn, curveOff []*LoadResult
	for _, r := range runs {
		switch {
		case r.FailRate >= 1 && r.Budget:
			outageOn = append(outageOn, r)
		case r.FailRate >= 1:
			outageOff = append(outageOff, r)
		}
		if r.Budget {
			curveOn = append(curveOn, r)
		} else {
			curveOff = append(curveOff, r)
		}
	}
	return []Check{
		outageBudgetBound(outageOn),
		outageEveryAttempt(outageOff),
		parkedChargedOnce(outageOn),
		overloadChargedOnce(runs),
		curveBudgetBound(curveOn),
		curveExpected(curveOff),
		herdFloor(herds),
		herdSpread(herds),
	}
}

func outageBudgetBound(runs []*LoadResult) Check {
	claim := fmt.Sprintf("outage, budget on: server requests at most %g x the first attempts, plus the %d tokens each Transport's bucket starts with",
		1+idemretry.DefaultBudgetRatio, idemretry.DefaultBudgetTokens)
	return everyRun(claim, runs, withinBudget, func(r *LoadResult) string {
		start := idemretry.DefaultBudgetTokens * r.Clients
		return fmt.Sprintf("%d requests for %d first attempts (%.2fx; bound %d); the retries beyond the %d starting tokens are %.3f per first attempt",
			r.Requests, r.FirstAttempts, ratio(r.Requests, r.FirstAttempts), BudgetBound(r.FirstAttempts, r.Clients), start,
			float64(r.Retries-start)/float64(max(r.FirstAttempts, 1)))
	})
}

// withinBudget: a run's every payment made its first attempt, and its
// requests stayed within BudgetBound.
func withinBudget(r *LoadResult) bool {
	return r.FirstAttempts == r.Intents && r.Requests <= BudgetBound(r.FirstAttempts, r.Clients)
}

// outageEveryAttempt: the baseline is what it claims to be. Without the
// budget every payment of the outage made its 6 attempts in it.
func outageEveryAttempt(runs []*LoadResult) Check {
	return everyRun(fmt.Sprintf("outage, budget off: every payment made all %d attempts inside the outage (the baseline)", idemretry.DefaultMaxRetries+1), runs,
		func(r *LoadResult) bool { return r.Requests == (idemretry.DefaultMaxRetries+1)*r.Intents },
		func(r *LoadResult) string {
			return fmt.Sprintf("%d requests for %d payments (%.2f each)", r.Requests, r.Intents, r.PerIntent())
		})
}

// parkedChargedOnce: the budget parks, it does not lose. Every parked
// payment came back after the outage and the server charged it once, under
// the key its first attempt carried.
func parkedChargedOnce(runs []*LoadResult) Check {
	return everyRun("outage, budget on: every parked payment was resent after the outage and charged exactly once, under the key of its first attempt (server's ledger)", runs,
		func(r *LoadResult) bool {
			return r.Parked > 0 && r.ParkedChargedOnce == r.Parked && r.Resent >= r.Parked
		},
		func(r *LoadResult) string {
			return fmt.Sprintf("%d of %d payments parked, %d resent; %d of the parked charged once under their first key",
				r.Parked, r.Intents, r.Resent, r.ParkedChargedOnce)
		})
}

// overloadChargedOnce: whatever the failure rate and the budget, every
// payment is confirmed and charged exactly once, under its first key.
func overloadChargedOnce(runs []*LoadResult) Check {
	const claim = "overload: every payment confirmed and charged exactly once, under the key of its first attempt; none charged twice (every failure rate, budget on and off)"
	if len(runs) == 0 {
		return skipped(claim)
	}
	ok := true
	intents, once, orig, dups, paid := 0, 0, 0, 0, 0
	var bad []string
	for _, r := range runs {
		intents += r.Intents
		once += r.ChargedOnce
		orig += r.OriginalKey
		dups += r.Duplicates
		paid += r.Paid
		good := r.Duplicates == 0 && r.ChargedOnce == r.Intents && r.OriginalKey == r.Intents && r.Paid == r.Intents
		if !good {
			bad = append(bad, fmt.Sprintf("%s, budget %s: %d charged once (%d under the first key), %d twice, %d confirmed of %d",
				pct(r.FailRate), r.BudgetLabel, r.ChargedOnce, r.OriginalKey, r.Duplicates, r.Paid, r.Intents))
		}
		ok = ok && good
	}
	detail := fmt.Sprintf("%d runs, %d payments: %d charged once, %d of them under their first key, %d charged twice, %d confirmed",
		len(runs), intents, once, orig, dups, paid)
	if len(bad) > 0 {
		detail += " (" + strings.Join(bad, "; ") + ")"
	}
	return Check{Claim: claim, Status: status(ok), Detail: detail}
}

func curveBudgetBound(runs []*LoadResult) Check {
	claim := fmt.Sprintf("load curve, budget on: at every failure rate, requests at most %g x the first attempts plus %d per Transport",
		1+idemretry.DefaultBudgetRatio, idemretry.DefaultBudgetTokens)
	return everyRun(claim, runs, withinBudget, func(r *LoadResult) string {
		return fmt.Sprintf("%s: %d <= %d", pct(r.FailRate), r.Requests, BudgetBound(r.FirstAttempts, r.Clients))
	})
}

func curveExpected(runs []*LoadResult) Check {
	return everyRun(fmt.Sprintf("load curve, budget off: requests per payment within %.0f%% of (1-p^6)/(1-p) at every failure rate p", 100*LoadTolerance), runs,
		func(r *LoadResult) bool { return math.Abs(r.PerIntent()/ExpectedLoad(r.FailRate)-1) <= LoadTolerance },
		func(r *LoadResult) string {
			return fmt.Sprintf("%s: %.2f (expected %.2f)", pct(r.FailRate), r.PerIntent(), ExpectedLoad(r.FailRate))
		})
}

func herdFloor(herds []*HerdResult) Check {
	const claim = "Retry-After, the library's rule: no client came back before the Retry-After it was told, in any round"
	h := pickHerd(herds, FloorRule)
	if h == nil {
		return skipped(claim)
	}
	first := minDuration(h.Earliest)
	return Check{Claim: claim, Status: status(first >= h.RetryAfter), Detail: fmt.Sprintf(
		"told %v; the first retry of %d rounds came %v after the 429s", h.RetryAfter, len(h.Earliest), first.Round(time.Millisecond))}
}

// HerdMinSpread is the least median window the library's rule must spread a
// herd over: a quarter of the first retry's drawn wait, U(0, 0.5 s), whose
// twenty draws span about 0.45 s.
const HerdMinSpread = idemretry.DefaultBaseDelay / 4

func herdSpread(herds []*HerdResult) Check {
	claim := fmt.Sprintf("Retry-After: the library's rule spreads the herd over a window wider than the old rule's, and at least %v (median of the rounds)", HerdMinSpread)
	floor, old := pickHerd(herds, FloorRule), pickHerd(herds, MaxRule)
	if floor == nil || old == nil {
		return skipped(claim)
	}
	nw, ow := floor.MedianWidth(), old.MedianWidth()
	return Check{Claim: claim, Status: status(nw > ow && nw >= HerdMinSpread), Detail: fmt.Sprintf(
		"%d clients come back within %v under the library's rule, %v under the old one",
		floor.Clients, nw.Round(time.Millisecond), ow.Round(time.Millisecond))}
}

func pickHerd(herds []*HerdResult, rule RetryAfterRule) *HerdResult {
	for _, h := range herds {
		if h.Rule == rule {
			return h
		}
	}
	return nil
}

func minDuration(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	m := xs[0]
	for _, x := range xs[1:] {
		m = min(m, x)
	}
	return m
}

func ratio(a, b int) float64 { return float64(a) / float64(max(b, 1)) }

func pct(p float64) string { return fmt.Sprintf("%.0f%%", 100*p) }
