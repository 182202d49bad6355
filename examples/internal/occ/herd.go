package occ

import "slices"

// Where the herd goes: without jitter, clients that failed together retry
// together, so at N = HerdClients their writes arrive in a few tight waves
// and most 10 ms bins between HerdFrom and HerdTo see no call at all, even
// pooled over HerdRuns runs, while full jitter spreads the same writes over
// every bin. The reference simulator pooled the write times of 100 runs in
// the same way; one run alone is too sparse (about 1.5 writes per bin) for
// "no empty bin" to hold for full jitter.
const (
	HerdClients = 190
	HerdRuns    = 100
	HerdFrom    = 200.0 // ms
	HerdTo      = 2000.0
	HerdBin     = 10.0
)

// Herd is the histogram of write arrivals per strategy.
type Herd struct {
	// Counts holds, per strategy, the writes that arrived in each HerdBin
	// bin from 0 to HerdTo, summed over HerdRuns runs.
	Counts map[string][]int
}

// HerdRun runs runs 0..HerdRuns-1 of seed for each named strategy at
// HerdClients clients and bins their writes. They are the same runs as the
// sweep's at that count.
func HerdRun(seed int64, names ...string) Herd {
	h := Herd{Counts: map[string][]int{}}
	var sim Sim
	for _, st := range Strategies() {
		if !slices.Contains(names, st.Name) {
			continue
		}
		counts := make([]int, int(HerdTo/HerdBin))
		for run := range HerdRuns {
			sim.Run(HerdClients, st, RunRand(seed, st.Name, HerdClients, run), func(at float64) {
				if at < HerdTo {
					counts[int(at/HerdBin)]++
				}
			})
		}
		h.Counts[st.Name] = counts
	}
	return h
}

// Empty returns how many bins of [HerdFrom, HerdTo) got no write under the
// strategy, and how many bins that window has.
// A strategy that was not run has no bins.
func (h Herd) Empty(strategy string) (empty, bins int) {
	counts := h.Counts[strategy]
	if len(counts) == 0 {
		return 0, 0
	}
	for _, c := range counts[int(HerdFrom/HerdBin):] {
		bins++
		if c == 0 {
			empty++
		}
	}
	return empty, bins
}
