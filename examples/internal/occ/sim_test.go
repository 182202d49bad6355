package occ

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
)

// Alone, a client's read-modify-write cannot lose: one call, four hops.
func TestSingleClientSucceedsInOneCall(t *testing.T) {
	var sim Sim
	for _, st := range Strategies() {
		for run := range 100 {
			res := sim.Run(1, st, RunRand(1, st.Name, 1, run), nil)
			if res.Calls != 1 {
				t.Fatalf("%s run %d: %d calls, want 1", st.Name, run, res.Calls)
			}
			// Four hops of |Normal(10, 2)| ms: 40 ms give or take.
			if res.Time < 20 || res.Time > 60 {
				t.Fatalf("%s run %d: completion %.1f ms, want about 40", st.Name, run, res.Time)
			}
		}
	}
}

// Each client succeeds exactly once, so there are at least n calls, and
// every write after the first success failed because someone got in first.
func TestEveryClientFinishes(t *testing.T) {
	var sim Sim
	for _, st := range Strategies() {
		var successes int
		var last float64
		res := sim.Run(30, st, RunRand(2, st.Name, 30, 0), func(at float64) {
			if at < last {
				t.Fatalf("%s: write at %.3f after one at %.3f", st.Name, at, last)
			}
			last = at
			successes++
		})
		if res.Calls < 30 || res.Calls != successes {
			t.Fatalf("%s: %d calls, %d seen by onCall, want >= 30 and equal", st.Name, res.Calls, successes)
		}
		if res.Time <= last {
			t.Fatalf("%s: completed at %.1f, before the last write arrived at %.1f", st.Name, res.Time, last)
		}
	}
}

// With no backoff, clients that collide retry at once; only the network's
// noise spreads them apart, and that must be enough for all to finish.
func TestNoneTerminatesUnderContention(t *testing.T) {
	st := Strategies()[4]
	if st.Name != "None" {
		t.Fatalf("Strategies()[4] = %s", st.Name)
	}
	var sim Sim
	res := sim.Run(190, st, rand.New(rand.NewPCG(3, 4)), nil)
	if res.Calls < 190 {
		t.Fatalf("%d calls", res.Calls)
	}
}

// Same seed, same numbers, whether the runs share one core or two; a
// different seed moves them.
func TestSweepIsDeterministic(t *testing.T) {
	plan := Plan{Seed: 42, Clients: []int{10, 40}, Runs: func(int) int { return 60 }}
	one, two := plan, plan
	one.Workers, two.Workers = 1, 2
	a, err := Sweep(context.Background(), one)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Sweep(context.Background(), two)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("1 worker and 2 workers differ:\n%v\n%v", a, b)
	}
	other := plan
	other.Seed = 43
	c, _ := Sweep(context.Background(), other)
	if reflect.DeepEqual(a, c) {
		t.Fatal("seeds 42 and 43 gave the same sweep")
	}
	// Narrowing the sweep leaves the remaining cells as they were.
	narrow := plan
	narrow.Clients = []int{40}
	d, _ := Sweep(context.Background(), narrow)
	if !reflect.DeepEqual(a[5:], d) {
		t.Fatalf("N=40 alone differs from N=40 in the sweep:\n%v\n%v", a[5:], d)
	}
}

func TestSweepStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Sweep(ctx, Plan{Clients: []int{190}, Runs: func(int) int { return 1000 }})
	if err == nil {
		t.Fatal("cancelled sweep returned no error")
	}
}

func TestSweepCountsProgress(t *testing.T) {
	var done int
	plan := Plan{Clients: []int{10, 20}, Runs: func(n int) int { return n + 3 }, Workers: 1,
		Progress: func(work int) { done += work }}
	if _, err := Sweep(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	want := 5 * (13*Work(10) + 23*Work(20))
	if done != want || plan.TotalWork() != want {
		t.Fatalf("progress counted %d, TotalWork %d, want %d", done, plan.TotalWork(), want)
	}
}
