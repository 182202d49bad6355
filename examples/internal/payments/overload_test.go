package payments

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
)

// smallOutage is the outage at a size and speed a test can afford: 2
// instances x 40 payments, the clock 40 times the wall clock.
func smallOutage(t *testing.T, budget bool) LoadConfig {
	cfg := OutageConfig(5).Sized(2, 40)
	cfg.Budget, cfg.Scale = budget, 40
	cfg.JournalDir = t.TempDir()
	return cfg
}

func runLoad(t *testing.T, cfg LoadConfig) *LoadResult {
	t.Helper()
	res, err := RunLoad(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s failing, budget %s: %d payments, %d requests (%.2f each), %d retries, %d parked, %d gave up, %d resent, %d charged once (%d under the first key), %d twice",
		pct(cfg.FailRate), cfg.BudgetLabel(), res.Intents, res.Requests, res.PerIntent(), res.Retries, res.Parked, res.GaveUp,
		res.Resent, res.ChargedOnce, res.OriginalKey, res.Duplicates)
	return res
}

// In a full outage the budget parks instead of retrying, within its bound;
// the parked payments come back after it under their first key and are
// charged once. Without it every payment makes its 6 attempts.
func TestOutageBudgetParksAndResends(t *testing.T) {
	off := runLoad(t, smallOutage(t, false))
	on := runLoad(t, smallOutage(t, true))
	if want := (idemretry.DefaultMaxRetries + 1) * off.Intents; off.Requests != want {
		t.Errorf("budget off: %d requests in the outage, want %d", off.Requests, want)
	}
	if bound := BudgetBound(on.FirstAttempts, on.Clients); on.Requests > bound {
		t.Errorf("budget on: %d requests, over the bound %d", on.Requests, bound)
	}
	if on.Parked == 0 || on.ParkedChargedOnce != on.Parked {
		t.Errorf("budget on: %d parked, %d of them charged once under their first key", on.Parked, on.ParkedChargedOnce)
	}
	for _, r := range []*LoadResult{off, on} {
		if r.Duplicates != 0 || r.ChargedOnce != r.Intents || r.OriginalKey != r.Intents || r.Paid != r.Intents {
			t.Errorf("budget %s: %d of %d charged once (%d under the first key), %d twice, %d confirmed",
				r.BudgetLabel, r.ChargedOnce, r.Intents, r.OriginalKey, r.Duplicates, r.Paid)
		}
	}
	for _, c := range OverloadChecks([]*LoadResult{off, on}, nil)[:4] {
		if c.Status != Pass {
			t.Errorf("%s: %s (%s)", c.Status, c.Claim, c.Detail)
		}
	}
}

// A failure rate below 1 fails some attempts and not others, the same ones
// whatever the client's timing: two budget-less runs of a seed send the
// same number of requests.
func TestFailRateIsSeeded(t *testing.T) {
	var got [2]*LoadResult
	for i := range got {
		cfg := LoadSweepConfig(9, 0.5).Sized(2, 30)
		cfg.Budget, cfg.Scale, cfg.JournalDir = false, 40, t.TempDir()
		got[i] = runLoad(t, cfg)
	}
	if got[0].Requests != got[1].Requests || got[0].Retries == 0 {
		t.Errorf("same seed: %d and %d requests (%d retries)", got[0].Requests, got[1].Requests, got[0].Retries)
	}
}

// The checks read the server's ledger, not the app's word: with a journal
// that forgets, the parked payments are resent under new keys, and the
// claims that they came back under their first key fail.
func TestOverloadChecksCatchANewKeyOnResend(t *testing.T) {
	cfg := smallOutage(t, true)
	cfg.WrapJournal = Forgetful
	res := runLoad(t, cfg)
	checks := OverloadChecks([]*LoadResult{res}, nil)
	wantStatus(t, checks, "outage, budget on: every parked payment", Fail)
	wantStatus(t, checks, "overload: every payment confirmed and charged exactly once", Fail)
	if res.Duplicates != 0 {
		t.Logf("and %d payments charged twice", res.Duplicates)
	}
}

// The bound bites: a Transport without a budget, labelled as having one,
// fails the claims that hold for the budget.
func TestOverloadChecksCatchAMissingBudget(t *testing.T) {
	cfg := smallOutage(t, true)
	cfg.Options = []idemretry.Option{idemretry.WithRetryBudget(0, 0)}
	res := runLoad(t, cfg)
	if !res.Budget {
		t.Fatal("the run is not labelled as budgeted")
	}
	checks := OverloadChecks([]*LoadResult{res}, nil)
	wantStatus(t, checks, "outage, budget on: server requests at most", Fail)
	wantStatus(t, checks, "load curve, budget on", Fail)
	wantStatus(t, checks, "outage, budget on: every parked payment", Fail) // nothing parked
}

func goodLoad(rate float64, budget bool) *LoadResult {
	r := &LoadResult{FailRate: rate, Budget: budget, BudgetLabel: "x", Clients: 4, Intents: 800, FirstAttempts: 800,
		Paid: 800, ChargedOnce: 800, OriginalKey: 800}
	r.Requests = int(ExpectedLoad(rate) * 800)
	if budget {
		r.Requests = min(r.Requests, 916)
		if rate >= 1 {
			r.Parked, r.Resent, r.ParkedChargedOnce = 800, 800, 800
		}
	} else if rate >= 1 {
		r.GaveUp, r.Resent = 800, 800
	}
	r.Retries = r.Requests - r.FirstAttempts
	return r
}

func goodLoads() []*LoadResult {
	var out []*LoadResult
	for _, p := range FailRates {
		out = append(out, goodLoad(p, false), goodLoad(p, true))
	}
	return out
}

func goodHerds() []*HerdResult {
	return []*HerdResult{
		{Rule: MaxRule, Clients: 20, RetryAfter: time.Second, Widths: []time.Duration{5 * time.Millisecond},
			Earliest: []time.Duration{time.Second}, Latest: []time.Duration{time.Second + 5*time.Millisecond}},
		{Rule: FloorRule, Clients: 20, RetryAfter: time.Second, Widths: []time.Duration{450 * time.Millisecond},
			Earliest: []time.Duration{1010 * time.Millisecond}, Latest: []time.Duration{1460 * time.Millisecond}},
	}
}

func TestOverloadChecksPassOnGoodRuns(t *testing.T) {
	for _, c := range OverloadChecks(goodLoads(), goodHerds()) {
		if c.Status != Pass {
			t.Errorf("%s: %s (%s)", c.Status, c.Claim, c.Detail)
		}
	}
}

func TestOverloadChecksSkipWhatWasNotPlayed(t *testing.T) {
	for _, c := range OverloadChecks(nil, nil) {
		if c.Status != Skip {
			t.Errorf("%s: %s with nothing played, want SKIP", c.Claim, c.Status)
		}
	}
}

// Each claim fails on the runs that break it.
func TestOverloadChecksFailOnBrokenRuns(t *testing.T) {
	find := func(runs []*LoadResult, rate float64, budget bool) *LoadResult {
		for _, r := range runs {
			if r.FailRate == rate && r.Budget == budget {
				return r
			}
		}
		t.Fatalf("no run %v %v", rate, budget)
		return nil
	}
	cases := []struct {
		name, claim string
		breakIt     func(runs []*LoadResult, herds []*HerdResult)
	}{
		{"one request over the bound", "outage, budget on: server requests at most", func(runs []*LoadResult, _ []*HerdResult) {
			r := find(runs, 1, true)
			r.Requests = BudgetBound(r.FirstAttempts, r.Clients) + 1
		}},
		{"a first attempt the server never saw", "outage, budget on: server requests at most", func(runs []*LoadResult, _ []*HerdResult) {
			find(runs, 1, true).FirstAttempts--
		}},
		{"a baseline payment short of its 6 attempts", "outage, budget off", func(runs []*LoadResult, _ []*HerdResult) {
			find(runs, 1, false).Requests--
		}},
		{"nothing parked", "outage, budget on: every parked payment", func(runs []*LoadResult, _ []*HerdResult) {
			r := find(runs, 1, true)
			r.Parked, r.ParkedChargedOnce = 0, 0
		}},
		{"a parked payment charged under a new key", "outage, budget on: every parked payment", func(runs []*LoadResult, _ []*HerdResult) {
			find(runs, 1, true).ParkedChargedOnce--
		}},
		{"a parked payment never resent", "outage, budget on: every parked payment", func(runs []*LoadResult, _ []*HerdResult) {
			find(runs, 1, true).Resent--
		}},
		{"a double charge", "overload: every payment confirmed", func(runs []*LoadResult, _ []*HerdResult) {
			r := find(runs, 0.5, false)
			r.Duplicates, r.ChargedOnce = 1, r.ChargedOnce-1
		}},
		{"a payment charged under a new key", "overload: every payment confirmed", func(runs []*LoadResult, _ []*HerdResult) {
			find(runs, 0.9, true).OriginalKey--
		}},
		{"a payment never confirmed", "overload: every payment confirmed", func(runs []*LoadResult, _ []*HerdResult) {
			find(runs, 0.1, true).Paid--
		}},
		{"a budgeted point over the bound", "load curve, budget on", func(runs []*LoadResult, _ []*HerdResult) {
			r := find(runs, 0.5, true)
			r.Requests = BudgetBound(r.FirstAttempts, r.Clients) + 1
		}},
		{"a baseline point off the expected load", "load curve, budget off", func(runs []*LoadResult, _ []*HerdResult) {
			r := find(runs, 0.9, false)
			r.Requests = int(ExpectedLoad(0.9) * float64(r.Intents) * (1 + 2*LoadTolerance))
		}},
		{"a client back before Retry-After", "Retry-After, the library's rule", func(_ []*LoadResult, herds []*HerdResult) {
			herds[1].Earliest[0] = herds[1].RetryAfter - time.Millisecond
		}},
		{"the library's rule not spreading", "Retry-After: the library's rule spreads", func(_ []*LoadResult, herds []*HerdResult) {
			herds[1].Widths[0] = 6 * time.Millisecond
		}},
		{"the library's rule narrower than the old", "Retry-After: the library's rule spreads", func(_ []*LoadResult, herds []*HerdResult) {
			herds[0].Widths[0] = 500 * time.Millisecond
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runs, herds := goodLoads(), goodHerds()
			tc.breakIt(runs, herds)
			checks := OverloadChecks(runs, herds)
			wantStatus(t, checks, tc.claim, Fail)
			if !Failed(checks) {
				t.Error("Failed = false")
			}
		})
	}
}

// The old rule is reproduced exactly: the Transport adds the Retry-After
// to what the backoff returns, so the backoff returns max(j, RA) - RA.
func TestMaxRuleBackOffReproducesTheOldRule(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Retry-After", "1")
	rec.WriteHeader(http.StatusTooManyRequests)
	limited := rec.Result()
	for _, j := range []time.Duration{0, 300 * time.Millisecond, time.Second, 1700 * time.Millisecond} {
		m := &maxRuleBackOff{clock: NewClock(1), jitter: fixedBackOff(j)}
		if !m.policy(context.Background(), limited, nil) {
			t.Fatal("a 429 is not retried")
		}
		if got, want := m.NextBackOff()+m.ra, max(j, time.Second); got != want {
			t.Errorf("draw %v: the Transport waits %v, the old rule %v", j, got, want)
		}
		m.policy(context.Background(), nil, context.DeadlineExceeded) // no Retry-After
		if got := m.NextBackOff(); got != j {
			t.Errorf("draw %v without Retry-After: %v", j, got)
		}
	}
}

type fixedBackOff time.Duration

func (f fixedBackOff) NextBackOff() time.Duration { return time.Duration(f) }
func (fixedBackOff) Reset()                       {}

// A herd round over real HTTP: every client comes back once, and none
// before the Retry-After, under either rule. (How wide the window is, is
// the simulation's figure, not a test's.)
func TestHerdComesBackAfterRetryAfter(t *testing.T) {
	for _, rule := range []RetryAfterRule{MaxRule, FloorRule} {
		cfg := DefaultHerd(rule)
		cfg.Clients, cfg.Rounds = 6, 2
		res, err := RunHerd(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Widths) != 2 {
			t.Fatalf("%s: %d rounds measured", rule, len(res.Widths))
		}
		if first := minDuration(res.Earliest); first < time.Second {
			t.Errorf("%s: a client came back %v after being told Retry-After: 1", rule, first)
		}
		t.Logf("%s: windows %v", rule, res.Widths)
	}
}

// The spread claim bites on a real herd: the old rule's herd, labelled as
// the library's rule, fails it. Played at twice the wall clock's speed, so
// that only machine stalls of 60 ms in most rounds could spread it.
func TestHerdSpreadCatchesTheOldRule(t *testing.T) {
	var herds []*HerdResult
	for range 2 {
		cfg := DefaultHerd(MaxRule)
		cfg.Clients, cfg.Rounds, cfg.Scale = 8, 3, 2
		res, err := RunHerd(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		herds = append(herds, res)
	}
	herds[1].Rule = FloorRule
	checks := OverloadChecks(nil, herds)
	wantStatus(t, checks, "Retry-After: the library's rule spreads", Fail)
	wantStatus(t, checks, "Retry-After, the library's rule: no client came back", Pass)
}

func TestHerdConfigRefused(t *testing.T) {
	for _, cfg := range []HerdConfig{{Clients: 1, Rounds: 1, RetryAfter: 1}, {Clients: 2, Rounds: 0, RetryAfter: 1}, {Clients: 2, Rounds: 1}} {
		if _, err := RunHerd(context.Background(), cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

func TestRunLoadRefusesEmptyConfigs(t *testing.T) {
	for _, cfg := range []LoadConfig{{}, OutageConfig(1)} { // the second has no JournalDir
		if _, err := RunLoad(context.Background(), cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
