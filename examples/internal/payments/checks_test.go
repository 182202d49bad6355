package payments

import (
	"strings"
	"testing"
)

// clean is a run with nothing wrong: every payment paid and charged once.
func clean(f Flavour) *Result {
	return &Result{Flavour: f, Strategy: "FullJitter", Intents: 30, Paid: 30}
}

// killed is a restart run of flavour f with 2 planned and done kills.
func killed(f Flavour, dups, resent int) *Result {
	r := clean(f)
	r.Crashes, r.PlannedKills, r.Killed, r.Resumed = 2, 2, 2, 2
	r.Duplicates, r.Extra, r.RestartDuplicates, r.KilledResent = dups, dups, dups, resent
	return r
}

func find(t *testing.T, checks []Check, claimPrefix string) Check {
	t.Helper()
	for _, c := range checks {
		if strings.HasPrefix(c.Claim, claimPrefix) {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", claimPrefix, checks)
	return Check{}
}

func wantStatus(t *testing.T, checks []Check, claimPrefix string, want Status) {
	t.Helper()
	if c := find(t, checks, claimPrefix); c.Status != want {
		t.Errorf("%s: %s (%s), want %s", c.Claim, c.Status, c.Detail, want)
	}
}

// Runs as they should be pass every check.
func TestChecksPassOnGoodRuns(t *testing.T) {
	n1, n2 := clean(Naive), clean(KeyPerAttempt)
	n1.Faulted, n1.FaultedPaid, n1.FaultedPaidTwice, n1.Duplicates = 3, 2, 2, 2
	n2.Faulted, n2.FaultedPaid, n2.FaultedPaidTwice, n2.Duplicates = 3, 3, 3, 3
	storm := []*Result{n1, n2, clean(MemoryKey), clean(FileJournal)}
	restart := []*Result{killed(Naive, 2, 0), killed(KeyPerAttempt, 2, 0), killed(MemoryKey, 2, 0), killed(FileJournal, 0, 2)}
	checks := append(StormChecks(storm), RestartChecks(restart)...)
	for _, c := range checks {
		if c.Status != Pass {
			t.Errorf("%s: %s (%s)", c.Status, c.Claim, c.Detail)
		}
	}
	if Failed(checks) {
		t.Error("Failed = true on passing checks")
	}
}

// Each claim fails on the runs that break it.
func TestChecksFailOnBrokenRuns(t *testing.T) {
	t.Run("storm duplicate under one strategy", func(t *testing.T) {
		bad := clean(FileJournal)
		bad.Strategy, bad.Duplicates = "Decorr", 1
		checks := StormChecks([]*Result{clean(FileJournal), bad})
		wantStatus(t, checks, "storm, flavour 4", Fail)
		if c := find(t, checks, "storm, flavour 4"); !strings.Contains(c.Detail, "Decorr: 1 of 30 charged 2+") {
			t.Errorf("detail %q does not name the run", c.Detail)
		}
		if !Failed(checks) {
			t.Error("Failed = false")
		}
	})
	t.Run("storm duplicate in memory", func(t *testing.T) {
		bad := clean(MemoryKey)
		bad.Duplicates = 1
		wantStatus(t, StormChecks([]*Result{bad}), "storm, flavour 3", Fail)
	})
	t.Run("storm keyless flavours charge once despite faults", func(t *testing.T) {
		r := clean(Naive)
		r.Faulted, r.FaultedPaid, r.FaultedPaidTwice = 3, 3, 2
		wantStatus(t, StormChecks([]*Result{r}), "storm, flavours 1-2", Fail)
		r.FaultedPaid, r.FaultedPaidTwice = 0, 0 // gave up on every faulted one: nothing to show
		wantStatus(t, StormChecks([]*Result{r}), "storm, flavours 1-2", Skip)
	})
	t.Run("lost charge", func(t *testing.T) {
		for _, f := range Flavours {
			r := clean(f)
			r.LostCharges = 1
			wantStatus(t, StormChecks([]*Result{r}), "storm: no lost charge", Fail)
			wantStatus(t, RestartChecks([]*Result{r}), "restart: no lost charge", Fail)
		}
	})
	t.Run("restart duplicate", func(t *testing.T) {
		wantStatus(t, RestartChecks([]*Result{killed(FileJournal, 1, 1)}), "restart, flavour 4 (idemretry+journal): no payment", Fail)
	})
	t.Run("killed payment resent under a new key", func(t *testing.T) {
		// The journal still listed both actions, as a forgetful one does.
		wantStatus(t, RestartChecks([]*Result{killed(FileJournal, 0, 1)}), "restart, flavour 4 (idemretry+journal): every killed", Fail)
	})
	t.Run("no kill happened", func(t *testing.T) {
		r := killed(FileJournal, 0, 0)
		r.Crashes, r.Killed = 0, 0
		wantStatus(t, RestartChecks([]*Result{r}), "restart, flavour 4 (idemretry+journal): every killed", Fail)
	})
	t.Run("fewer kills than planned", func(t *testing.T) {
		r := killed(FileJournal, 0, 1)
		r.Crashes, r.Killed = 1, 1
		wantStatus(t, RestartChecks([]*Result{r}), "restart, flavour 4 (idemretry+journal): every killed", Fail)
	})
	t.Run("restart gave up", func(t *testing.T) {
		r := killed(FileJournal, 0, 2)
		r.Paid, r.GaveUp = 29, 1
		wantStatus(t, RestartChecks([]*Result{r}), "restart, flavour 4 (idemretry+journal): every payment confirmed", Fail)
	})
	t.Run("restart without a durable key charged once", func(t *testing.T) {
		wantStatus(t, RestartChecks([]*Result{killed(MemoryKey, 1, 0)}), "restart, flavours 1-3", Fail)
	})
}

// A claim about runs that were not played is skipped, not passed.
func TestChecksSkipWhatWasNotPlayed(t *testing.T) {
	for _, c := range append(StormChecks(nil), RestartChecks(nil)...) {
		if c.Status != Skip {
			t.Errorf("%s: %s with no runs, want SKIP", c.Claim, c.Status)
		}
	}
}

// The ledger counts a killed payment as resent under its old key only if
// the server answered that very key from its store.
func TestResentUnderOldKey(t *testing.T) {
	log := []Request{
		// pi_a: charged, cut, resent under the same key: replayed.
		{Intent: "pi_a", Key: "k1", Status: StatusDropped, Charged: true},
		{Intent: "pi_a", Key: "k1", Status: 200, Replayed: true},
		// pi_b: charged, cut, resent under a new key: charged again.
		{Intent: "pi_b", Key: "k2", Status: StatusDropped, Charged: true},
		{Intent: "pi_b", Key: "k3", Status: 200, Charged: true},
		// pi_c: answered, then replayed: no cut, nothing to resend.
		{Intent: "pi_c", Key: "k4", Status: 200, Charged: true},
		{Intent: "pi_c", Key: "k4", Status: 200, Replayed: true},
		// pi_d: a replayed key that belongs to another intent's charge.
		{Intent: "pi_d", Key: "k5", Status: StatusDropped, Charged: true},
		{Intent: "pi_e", Key: "k5", Status: 200, Replayed: true},
	}
	got := resentUnderOldKey(log)
	if !got["pi_a"] || got["pi_b"] || got["pi_c"] || got["pi_d"] || got["pi_e"] || len(got) != 1 {
		t.Errorf("resent = %v, want only pi_a", got)
	}
}
