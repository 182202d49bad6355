package occ

import (
	"cmp"
	"context"
	"math"
	"runtime"
	"slices"
	"sync"
)

// Cell is the mean outcome of one strategy at one client count.
type Cell struct {
	Strategy string
	Clients  int
	Runs     int
	Calls    float64 // mean calls per run
	Time     float64 // mean completion time per run, ms
	CallsSD  float64 // standard deviation across runs
	TimeSD   float64
}

// Plan says what a sweep runs.
type Plan struct {
	Seed       int64
	Clients    []int           // client counts, in the order wanted
	Strategies []Strategy      // nil: all of Strategies()
	Runs       func(n int) int // runs per cell at n clients
	Workers    int             // goroutines; <= 0: GOMAXPROCS
	// Progress, if not nil, is told the work (see Work) of the runs that
	// just finished. It is called from the workers, so it must be safe for
	// concurrent use.
	Progress func(work int)
}

// Work estimates what one run at n clients costs, in arbitrary units: a
// run's events grow as about n^1.5. A progress bar counting runs would
// crawl through the big cells and race through the small ones.
func Work(n int) int { return int(float64(n) * math.Sqrt(float64(n))) }

// TotalWork is the Work of all the plan's runs, for a progress bar.
func (p Plan) TotalWork() int {
	t := 0
	for _, n := range p.Clients {
		t += p.Runs(n) * len(p.strategies()) * Work(n)
	}
	return t
}

func (p Plan) strategies() []Strategy {
	if p.Strategies == nil {
		return Strategies()
	}
	return p.Strategies
}

// chunk is how many runs of one cell a worker takes at a time: enough to
// make the hand-off cheap next to the work, few enough to keep both cores
// busy to the end.
const chunk = 25

type job struct {
	cell     int
	from, to int
}

// Sweep runs every (strategy, clients) cell of the plan and returns the
// cells ordered by clients (in plan order), then strategy (in plan order).
// Each run's result is kept in its own slot and the means are summed in
// run order, so the output is bit-for-bit the same however the runs were
// scheduled. It stops early with ctx's error if ctx is cancelled.
func Sweep(ctx context.Context, p Plan) ([]Cell, error) {
	strats := p.strategies()
	var cells []Cell
	var results [][]Result
	for _, n := range p.Clients {
		for _, st := range strats {
			runs := p.Runs(n)
			cells = append(cells, Cell{Strategy: st.Name, Clients: n, Runs: runs})
			results = append(results, make([]Result, runs))
		}
	}

	var jobs []job
	for i, c := range cells {
		for from := 0; from < c.Runs; from += chunk {
			jobs = append(jobs, job{i, from, min(from+chunk, c.Runs)})
		}
	}
	// Biggest cells first (a run's work grows faster than its clients), so
	// that no long job starts last and leaves a core idle at the end.
	slices.SortStableFunc(jobs, func(a, b job) int {
		return cmp.Compare(cells[b.cell].Clients, cells[a.cell].Clients)
	})

	workers := p.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	feed := make(chan job)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sim Sim
			for j := range feed {
				c := cells[j.cell]
				st := strats[j.cell%len(strats)]
				for run := j.from; run < j.to; run++ {
					r := RunRand(p.Seed, c.Strategy, c.Clients, run)
					results[j.cell][run] = sim.Run(c.Clients, st, r, nil)
				}
				if p.Progress != nil {
					p.Progress((j.to - j.from) * Work(c.Clients))
				}
			}
		}()
	}
	var err error
feeding:
	for _, j := range jobs {
		select {
		case feed <- j:
		case <-ctx.Done():
			err = ctx.Err()
			break feeding
		}
	}
	close(feed)
	wg.Wait()
	if err != nil {
		return nil, err
	}

	for i := range cells {
		cells[i].Calls, cells[i].CallsSD = meanSD(results[i], func(r Result) float64 { return float64(r.Calls) })
		cells[i].Time, cells[i].TimeSD = meanSD(results[i], func(r Result) float64 { return r.Time })
	}
	return cells, nil
}

// meanSD returns the mean and sample standard deviation of f over rs, in
// order.
func meanSD(rs []Result, f func(Result) float64) (mean, sd float64) {
	if len(rs) == 0 {
		return math.NaN(), math.NaN()
	}
	for _, r := range rs {
		mean += f(r)
	}
	mean /= float64(len(rs))
	if len(rs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, r := range rs {
		d := f(r) - mean
		ss += d * d
	}
	return mean, math.Sqrt(ss / float64(len(rs)-1))
}
