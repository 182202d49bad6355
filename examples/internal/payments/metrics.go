package payments

import (
	"net/http"
	"slices"
	"time"
)

// Bucket is the width of the request-rate histogram.
const Bucket = 10 * time.Millisecond

// Result is what one run measured. Durations are virtual time.
type Result struct {
	Flavour  Flavour
	Strategy string
	Intents  int

	// Duplicates counts intents charged twice or more; Extra counts the
	// charges beyond the first. RestartDuplicates counts the duplicates
	// among intents whose client was killed during them.
	Duplicates, Extra, RestartDuplicates int
	Crashes, Resumed                     int // processes killed; actions their journals listed on restart

	// Paid counts the intents the client reported paid; LostCharges counts
	// those among them the server never charged (a success the client was
	// told about and nobody paid for).
	Paid, LostCharges int
	// PlannedKills is how many processes the run meant to kill, Killed how
	// many intents were in progress when their process was killed, and
	// KilledResent how many of those the server saw again under the key it
	// had charged them under, and answered from its key store: the
	// server's own ledger, not the client's word.
	PlannedKills, Killed, KilledResent int
	// Faulted counts the intents the server's fault plan faulted;
	// FaultedPaid those among them the client reported paid, and
	// FaultedPaidTwice those of these the server charged twice or more.
	Faulted, FaultedPaid, FaultedPaidTwice int

	Requests      int
	Amplification float64 // requests per intent
	// Buckets counts requests per Bucket of virtual time from the start.
	Buckets []int
	// PeakAfterOutage is the largest bucket from the outage's end on;
	// Rejected503AfterRecovery counts 503s sent after the outage ended
	// (load shed during the warm-up).
	PeakAfterOutage, Rejected503AfterRecovery int
	Status                                    map[int]int // requests per status (0: dropped)
	Late                                      int         // answers written after the client hung up

	P50, P99 time.Duration // time to success, first attempt to success
	GaveUp   int           // payments the client ended without success
	Outage   Outage
	Wall     time.Duration // wall time the run took
	// Stall is the longest time the machine froze the process, in virtual
	// time; Plays counts how often the run was played to get one below
	// the limit (see Play).
	Stall, StallLimit time.Duration
	Plays             int
}

func (r *run) measure() *Result {
	res := &Result{
		Flavour: r.cfg.Flavour, Strategy: r.cfg.Strategy.Name, Outage: r.cfg.Outage,
		Crashes: int(r.crashes.Load()), Resumed: int(r.resumed.Load()),
		Status: map[int]int{}, Late: r.server.LateAnswers(),
		PlannedKills: r.plannedKills,
	}
	faulted := r.server.Faulted()
	charges := r.server.Charges()
	log := r.server.Log()
	resent := resentUnderOldKey(log)
	var times []time.Duration
	for _, row := range r.intents {
		for _, in := range row {
			res.Intents++
			n := charges[in.ID]
			if n > 1 {
				res.Duplicates++
				res.Extra += n - 1
				if in.crashed {
					res.RestartDuplicates++
				}
			}
			if in.crashed {
				res.Killed++
				if resent[in.ID] {
					res.KilledResent++
				}
			}
			if faulted[in.ID] {
				res.Faulted++
				if in.ok {
					res.FaultedPaid++
					if n > 1 {
						res.FaultedPaidTwice++
					}
				}
			}
			if in.ok {
				res.Paid++
				if n == 0 {
					res.LostCharges++
				}
				times = append(times, in.end.Sub(in.start))
			} else {
				res.GaveUp++
			}
		}
	}
	res.P50, res.P99 = percentile(times, 0.50), percentile(times, 0.99)

	res.Requests = len(log)
	res.Amplification = float64(res.Requests) / float64(max(res.Intents, 1))
	recovered := r.cfg.Outage.End > r.cfg.Outage.Start
	for _, q := range log {
		res.Status[q.Status]++
		b := int(max(q.At, 0) / Bucket)
		for len(res.Buckets) <= b {
			res.Buckets = append(res.Buckets, 0)
		}
		res.Buckets[b]++
		if recovered && q.At >= r.cfg.Outage.End && q.Status == http.StatusServiceUnavailable {
			res.Rejected503AfterRecovery++
		}
	}
	if recovered {
		for b := int(r.cfg.Outage.End / Bucket); b < len(res.Buckets); b++ {
			res.PeakAfterOutage = max(res.PeakAfterOutage, res.Buckets[b])
		}
	}
	return res
}

// resentUnderOldKey reads the server's ledger: an intent is in the set if a
// request that committed its charge lost its answer (the connection was
// cut, as when the client is killed) and a request under that same key was
// later answered from the key store. A client that came back under a new
// key is not in it, whatever it says.
func resentUnderOldKey(log []Request) map[string]bool {
	type charge struct{ intent, key string }
	cut := map[charge]bool{}
	for _, q := range log {
		if q.Charged && q.Status == StatusDropped && q.Key != "" {
			cut[charge{q.Intent, q.Key}] = true
		}
	}
	out := map[string]bool{}
	for _, q := range log {
		if q.Replayed && cut[charge{q.Intent, q.Key}] {
			out[q.Intent] = true
		}
	}
	return out
}

// percentile returns the nearest-rank p-quantile, or 0 for no samples.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
