package payments

import (
	"fmt"
	"slices"
	"strings"
)

// Status is a check's outcome.
type Status string

const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP" // the runs needed for the claim were not played
)

// A Check is one claim of the scenario, tested on the runs it played.
type Check struct {
	Claim  string
	Status Status
	Detail string // the numbers behind the status
}

// Failed reports whether any check failed.
func Failed(checks []Check) bool {
	return slices.ContainsFunc(checks, func(c Check) bool { return c.Status == Fail })
}

// StormChecks tests the storm phase's claims: one key per action (flavours
// 3 and 4) never charges twice, whatever the strategy; without one
// (flavours 1 and 2) lost and late answers do charge twice; and no flavour
// is told a payment succeeded that the server never charged.
func StormChecks(results []*Result) []Check {
	return []Check{
		noDuplicates("storm, flavour 4 (idemretry+journal): no payment charged twice, under every strategy",
			pick(results, FileJournal)),
		noDuplicates("storm, flavour 3 (key in memory): no payment charged twice",
			pick(results, MemoryKey)),
		keylessDuplicate(pick(results, Naive, KeyPerAttempt)),
		noLostCharge("storm", results),
	}
}

// RestartChecks tests the restart phase's claims: flavour 4 charges no
// payment twice, because every killed process's payment was resent under
// its old key (counted from the server's ledger) and replayed; it confirms
// every payment; every other flavour is charged twice for each killed
// payment; and no payment is reported paid that was never charged.
func RestartChecks(results []*Result) []Check {
	journal := pick(results, FileJournal)
	return []Check{
		noDuplicates("restart, flavour 4 (idemretry+journal): no payment charged twice", journal),
		resentUnderOldKeys(journal),
		allPaid(journal),
		restartDuplicates(pick(results, Naive, KeyPerAttempt, MemoryKey)),
		noLostCharge("restart", results),
	}
}

// pick returns the results of the given flavours, in order.
func pick(results []*Result, fs ...Flavour) []*Result {
	var out []*Result
	for _, r := range results {
		if slices.Contains(fs, r.Flavour) {
			out = append(out, r)
		}
	}
	return out
}

// label names a run in a detail: its strategy, and its flavour when the
// claim covers more than one.
func label(r *Result, withFlavour bool) string {
	if withFlavour {
		return fmt.Sprintf("%s (%s)", r.Flavour, r.Strategy)
	}
	return r.Strategy
}

func skipped(claim string) Check {
	return Check{Claim: claim, Status: Skip, Detail: "not played in this invocation"}
}

func status(ok bool) Status {
	if ok {
		return Pass
	}
	return Fail
}

// everyRun is the claim that every run passes: it passes when all do, and
// its detail is each run's, in order. Without runs it is skipped.
func everyRun[R any](claim string, runs []R, pass func(R) bool, detail func(R) string) Check {
	if len(runs) == 0 {
		return skipped(claim)
	}
	ok := true
	parts := make([]string, 0, len(runs))
	for _, r := range runs {
		ok = pass(r) && ok
		parts = append(parts, detail(r))
	}
	return Check{Claim: claim, Status: status(ok), Detail: strings.Join(parts, "; ")}
}

func noDuplicates(claim string, runs []*Result) Check {
	return everyRun(claim, runs, func(r *Result) bool { return r.Duplicates == 0 }, func(r *Result) string {
		p := fmt.Sprintf("%s: %d of %d charged 2+", r.Strategy, r.Duplicates, r.Intents)
		if r.Crashes > 0 {
			p += fmt.Sprintf(" (%d of %d killed payments)", r.RestartDuplicates, r.Killed)
		}
		return p
	})
}

// keylessDuplicate: a client without one key per action that confirms a
// payment whose first answer was lost (or came after its timeout) has had
// it processed twice, so charged twice. Payments the client gave up on
// prove nothing either way and are left out.
func keylessDuplicate(runs []*Result) Check {
	const claim = "storm, flavours 1-2 (no key, key per attempt): every payment they confirmed after a lost or late answer was charged twice"
	if len(runs) == 0 {
		return skipped(claim)
	}
	ok, shown := true, 0
	var parts []string
	for _, r := range runs {
		shown += r.FaultedPaid
		ok = ok && r.FaultedPaidTwice == r.FaultedPaid
		parts = append(parts, fmt.Sprintf("%s: %d of %d (%d faulted, %d charged 2+ in all)",
			label(r, true), r.FaultedPaidTwice, r.FaultedPaid, r.Faulted, r.Duplicates))
	}
	if shown == 0 {
		return Check{Claim: claim, Status: Skip, Detail: "no faulted payment confirmed: " + strings.Join(parts, "; ")}
	}
	return Check{Claim: claim, Status: status(ok), Detail: strings.Join(parts, "; ")}
}

// resentUnderOldKeys: the server's ledger shows each killed payment's
// charging key again, answered from the key store, and every planned kill
// happened.
func resentUnderOldKeys(runs []*Result) Check {
	return everyRun("restart, flavour 4 (idemretry+journal): every killed process's payment was resent under its old key, and the server replayed it", runs,
		func(r *Result) bool { return r.Killed > 0 && r.Killed == r.PlannedKills && r.KilledResent == r.Killed },
		func(r *Result) string {
			return fmt.Sprintf("the server replayed the charged key of %d of %d killed payments (%d kills planned; the restarted journals listed %d unfinished actions)",
				r.KilledResent, r.Killed, r.PlannedKills, r.Resumed)
		})
}

// allPaid: with no faults but the kills, flavour 4 confirms every payment,
// so its zero duplicates are not the zero of a client that stopped paying.
func allPaid(runs []*Result) Check {
	return everyRun("restart, flavour 4 (idemretry+journal): every payment confirmed paid", runs,
		func(r *Result) bool { return r.Paid == r.Intents },
		func(r *Result) string { return fmt.Sprintf("paid %d of %d", r.Paid, r.Intents) })
}

// restartDuplicates: with no other fault, a client whose key does not
// survive the process is charged twice for every payment it was killed in.
func restartDuplicates(runs []*Result) Check {
	return everyRun("restart, flavours 1-3 (no durable key): each killed payment is charged twice", runs,
		func(r *Result) bool { return r.Killed > 0 && r.RestartDuplicates == r.Killed },
		func(r *Result) string { return fmt.Sprintf("%s: %d of %d", r.Flavour, r.RestartDuplicates, r.Killed) })
}

// noLostCharge: no client is told a payment succeeded that the server
// never charged (a replay of another payment's answer, say).
func noLostCharge(phase string, runs []*Result) Check {
	claim := phase + ": no lost charge (a payment reported paid that the server never charged), in any flavour"
	if len(runs) == 0 {
		return skipped(claim)
	}
	paid, lost := 0, 0
	var bad []string
	for _, r := range runs {
		paid += r.Paid
		lost += r.LostCharges
		if r.LostCharges > 0 {
			bad = append(bad, fmt.Sprintf("%s: %d", label(r, true), r.LostCharges))
		}
	}
	detail := fmt.Sprintf("%d of %d payments reported paid were never charged, over %d %s", lost, paid, len(runs), plural(len(runs), "run"))
	if len(bad) > 0 {
		detail += " (" + strings.Join(bad, "; ") + ")"
	}
	return Check{Claim: claim, Status: status(lost == 0), Detail: detail}
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
