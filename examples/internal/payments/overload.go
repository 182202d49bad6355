package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// LoadBucket is the width of the overload runs' request-rate histogram.
const LoadBucket = 250 * time.Millisecond

// LoadConfig is one run of the overload phase: app instances (one process
// each, with its Transport and file journal) make payments at a fixed pace,
// each in its own goroutine (open loop: a payment does not wait for the one
// before it, as requests from users do not), while the server fails a share
// of the attempts. When the failures end, each instance resends every
// payment that was not confirmed (parked by the retry budget, or given up)
// under the same action id, as an app does after ErrParked. Durations are
// virtual time.
type LoadConfig struct {
	Seed  int64
	Scale float64 // virtual time runs Scale times faster than the wall clock

	Clients  int           // app instances: one Transport and one file journal each
	Intents  int           // payments per instance
	Interval time.Duration // between two payments of one instance

	// FailRate is the share of attempts that fail fast with 503 while the
	// failures last (see ServerConfig.FailRate): 1 is a full outage.
	FailRate float64
	// FailFor is how long the failures last at least; they end then, or
	// once every payment's first RoundTrip has returned, whichever is
	// later, so that every retry a Transport wanted to make met them.
	FailFor time.Duration

	// Budget leaves the Transport's default retry budget on; false turns it
	// off (WithRetryBudget(0, 0)).
	Budget bool
	// Options come after the payer's own (and after the budget's): a seam
	// for tests that break the configuration on purpose, to show that the
	// checks catch it. Nil in the real scenario.
	Options []idemretry.Option
	// WrapJournal, if set, wraps each instance's journal (see
	// Config.WrapJournal). Nil in the real scenario.
	WrapJournal func(journal.Journal) journal.Journal

	Resenders      int // resends in flight at once per instance after the failures
	AttemptTimeout time.Duration
	JournalDir     string // one directory per instance under it
}

// OutageTail is how long a full outage lasts after the last payment began:
// longer than the 15.5 s of drawn waits a payment can spend on its 5
// retries.
const OutageTail = 17 * time.Second

// OutageConfig is the overload phase's full outage: 4 instances making a
// payment every 20 ms each for 4 s, every attempt failing until the outage
// ends OutageTail after the last payment began, so that without the budget
// every payment makes all 6 attempts inside the outage. It runs at the
// payments scenario's scale, so that its picture over time is as faithful
// as the storm's.
func OutageConfig(seed int64) LoadConfig {
	c := LoadConfig{
		Seed: seed, Scale: 10,
		Clients: 4, Intents: 200, Interval: 20 * time.Millisecond,
		FailRate: 1, Budget: true,
		Resenders: 8, AttemptTimeout: time.Minute,
	}
	c.FailFor = c.Arrivals() + OutageTail
	return c
}

// Sized returns c with clients instances making intents payments each; a
// full outage still ends OutageTail after the last payment began.
func (c LoadConfig) Sized(clients, intents int) LoadConfig {
	c.Clients, c.Intents = clients, intents
	if c.FailRate >= 1 {
		c.FailFor = c.Arrivals() + OutageTail
	}
	return c
}

// FailRates are the overload phase's failure rates, as in Brooker's
// "Fixing retries with token buckets and circuit breakers" (2022).
var FailRates = []float64{0, 0.1, 0.5, 0.9, 1}

// LoadSweepConfig is one point of the load curve: OutageConfig's fleet with
// a share rate of the attempts failing, at random. Below 1 the failures
// last as long as the payments take, and the run goes twice as fast: it
// counts requests, it draws no picture over time.
func LoadSweepConfig(seed int64, rate float64) LoadConfig {
	c := OutageConfig(seed)
	c.FailRate = rate
	if rate < 1 {
		c.FailFor, c.Scale = 0, 20
	}
	return c
}

// Arrivals is how long the instances take to begin all their payments.
func (c LoadConfig) Arrivals() time.Duration { return time.Duration(c.Intents) * c.Interval }

// BudgetLabel names the run's budget setting.
func (c LoadConfig) BudgetLabel() string {
	if c.Budget {
		return fmt.Sprintf("on (%d, %g)", idemretry.DefaultBudgetTokens, idemretry.DefaultBudgetRatio)
	}
	return "off"
}

// ExpectedLoad is what a client retrying up to DefaultMaxRetries times
// sends per payment when each attempt fails independently with
// probability p: 1 + p + ... + p^5 = (1-p^6)/(1-p), 1/(1-p) capped at 6.
func ExpectedLoad(p float64) float64 {
	n := float64(idemretry.DefaultMaxRetries + 1)
	if p >= 1 {
		return n
	}
	return (1 - math.Pow(p, n)) / (1 - p)
}

// LoadResult is what one overload run measured, from the server's ledger
// and the app's own record. Durations are virtual time.
type LoadResult struct {
	FailRate     float64
	Budget       bool
	BudgetLabel  string
	Scale        float64
	Clients      int
	Intents      int           // payments made
	FailEnd      time.Duration // when the failures ended
	ArrivalsSpan time.Duration

	// During the failures.
	FirstAttempts int // payments whose first attempt the server saw
	Requests      int // requests that reached the server
	Retries       int // Requests - FirstAttempts
	PaidAtOnce    int // payments the first RoundTrip confirmed
	Parked        int // payments the budget parked (ErrParked)
	GaveUp        int // other unconfirmed payments (retries exhausted)

	// After the failures.
	Resent         int // payments resent by the app
	ResendRequests int // requests those resends made
	Paid           int // payments confirmed in the end

	// From the server's ledger, over the whole run.
	ChargedOnce int // payments charged exactly once
	OriginalKey int // of them, charged under the key of their first attempt
	Duplicates  int // payments charged twice or more
	// ParkedChargedOnce counts the parked payments charged exactly once,
	// under the key of their first attempt.
	ParkedChargedOnce int

	Buckets []int // requests per LoadBucket from the start

	// Stall is the longest time the machine froze the process, in virtual
	// time; Plays counts how often the run was played to get one below
	// LoadStallLimit (see PlayLoad).
	Wall, Stall time.Duration
	Plays       int
}

// LoadStallLimit is the longest machine stall, in virtual time, an overload
// run may suffer and still count as undisturbed: a stall delays the
// payments due during it and then sends them at once, a burst the clients
// did not make. Two of the picture's buckets.
const LoadStallLimit = 2 * LoadBucket

// Disturbed reports whether the machine stalled the run for longer than
// LoadStallLimit.
func (r *LoadResult) Disturbed() bool { return r.Stall > LoadStallLimit }

// PlayLoad runs cfg, and runs it again (up to MaxPlays in all, with a fresh
// journal directory each time) while the machine stalls it past
// LoadStallLimit. It returns the last play; LoadResult.Plays says how many
// it took.
func PlayLoad(ctx context.Context, cfg LoadConfig) (*LoadResult, error) {
	base := cfg.JournalDir
	return playWhileDisturbed(ctx, func(play int) (*LoadResult, error) {
		if play > 1 {
			cfg.JournalDir = fmt.Sprintf("%s-replay%d", base, play)
		}
		res, err := RunLoad(ctx, cfg)
		if err == nil {
			res.Plays = play
		}
		return res, err
	})
}

// PerIntent is the server's load: requests per payment during the
// failures.
func (r *LoadResult) PerIntent() float64 { return float64(r.Requests) / float64(max(r.Intents, 1)) }

// loadIntent is one payment of an overload run and what became of it.
type loadIntent struct {
	*Intent
	paidAtOnce, parked, resent, paid bool
}

// RunLoad plays one overload run.
func RunLoad(ctx context.Context, cfg LoadConfig) (*LoadResult, error) {
	if cfg.Clients < 1 || cfg.Intents < 1 || cfg.Interval <= 0 {
		return nil, fmt.Errorf("payments: overload run needs clients, intents and an interval (got %d, %d, %v)", cfg.Clients, cfg.Intents, cfg.Interval)
	}
	if cfg.JournalDir == "" {
		return nil, errors.New("payments: overload run needs a JournalDir")
	}
	wall := time.Now()
	clk := NewClock(cfg.Scale)
	server := NewServer(ServerConfig{Clock: clk, Epoch: clk.Now(), FailRate: cfg.FailRate, FailSeed: cfg.Seed})
	defer server.Close()

	payers := make([]*keyedPayer, cfg.Clients)
	intents := make([][]*loadIntent, cfg.Clients)
	closeAll := func() error {
		var err error
		for _, p := range payers {
			if p != nil {
				err = errors.Join(err, p.close())
			}
		}
		return err
	}
	for c := range cfg.Clients {
		name := fmt.Sprintf("app-%02d", c)
		dir := filepath.Join(cfg.JournalDir, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			closeAll()
			return nil, err
		}
		var opts []idemretry.Option
		if !cfg.Budget {
			opts = append(opts, idemretry.WithRetryBudget(0, 0))
		}
		opts = append(opts, cfg.Options...)
		// The Transport's own default backoff (full jitter, its own random
		// source, safe for the many payments each instance has in flight).
		p, err := newKeyedPayerOn(newBaseIdle(clk, cfg.AttemptTimeout, 64), FileJournal, server.URL(), name, dir,
			Strategy{}, nil, clk, cfg.WrapJournal, opts...)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%s: start: %w", name, err)
		}
		payers[c] = p
		for i := range cfg.Intents {
			intents[c] = append(intents[c], &loadIntent{Intent: newIntent(c, i)})
		}
	}

	server.SetFailing(true)
	start := clk.Now()
	server.SetEpoch(start)
	stalls := watchStalls()
	// The failures: each instance begins a payment every Interval, the
	// instances evenly staggered, and keeps its result.
	var wg sync.WaitGroup
	for i := range cfg.Intents {
		for c := range cfg.Clients {
			offset := cfg.Interval * time.Duration(c) / time.Duration(cfg.Clients)
			sleepUntil(ctx, clk, start.Add(offset+time.Duration(i)*cfg.Interval))
			if ctx.Err() != nil {
				break
			}
			in := intents[c][i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := payers[c].payErr(ctx, in.Intent)
				in.paidAtOnce, in.paid = ok, ok
				in.parked = errors.Is(err, idemretry.ErrParked)
			}()
		}
	}
	wg.Wait()
	sleepUntil(ctx, clk, start.Add(cfg.FailFor))
	failEnd := clk.Now().Sub(start)
	server.SetFailing(false)

	// After: every instance resends what it could not confirm, the same
	// action id and body, a few at a time.
	for c := range cfg.Clients {
		sem := make(chan struct{}, max(cfg.Resenders, 1))
		for _, in := range intents[c] {
			if in.paid || ctx.Err() != nil {
				continue
			}
			in.resent = true
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				in.paid, _ = payers[c].payErr(ctx, in.Intent)
			}()
		}
	}
	wg.Wait()
	stall := stalls.finish()
	err := closeAll()
	server.Close()
	if err != nil {
		return nil, err
	}
	res := measureLoad(cfg, server, intents, failEnd)
	res.Wall, res.Stall, res.Plays = time.Since(wall), clk.Virtual(stall), 1
	return res, ctx.Err()
}

// sleepUntil waits on clk until the virtual time t, or ctx's end.
func sleepUntil(ctx context.Context, clk *Clock, t time.Time) {
	sleepCtx(ctx, clk, t.Sub(clk.Now()))
}

func measureLoad(cfg LoadConfig, server *Server, intents [][]*loadIntent, failEnd time.Duration) *LoadResult {
	res := &LoadResult{
		FailRate: cfg.FailRate, Budget: cfg.Budget, BudgetLabel: cfg.BudgetLabel(), Scale: cfg.Scale,
		Clients: cfg.Clients, FailEnd: failEnd, ArrivalsSpan: cfg.Arrivals(),
	}
	log := server.Log()
	slices.SortStableFunc(log, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	firstKey := map[string]string{}  // intent -> key of its first request
	chargeKey := map[string]string{} // intent -> key of the request that charged it
	for _, q := range log {
		if q.Intent != "" {
			if _, ok := firstKey[q.Intent]; !ok {
				firstKey[q.Intent] = q.Key
				if q.At < failEnd {
					res.FirstAttempts++
				}
			}
		}
		if q.Charged {
			chargeKey[q.Intent] = q.Key
		}
		if q.At < failEnd {
			res.Requests++
		} else {
			res.ResendRequests++
		}
		b := int(max(q.At, 0) / LoadBucket)
		for len(res.Buckets) <= b {
			res.Buckets = append(res.Buckets, 0)
		}
		res.Buckets[b]++
	}
	res.Retries = res.Requests - res.FirstAttempts
	charges := server.Charges()
	for _, row := range intents {
		for _, in := range row {
			res.Intents++
			switch {
			case in.paidAtOnce:
				res.PaidAtOnce++
			case in.parked:
				res.Parked++
			default:
				res.GaveUp++
			}
			if in.resent {
				res.Resent++
			}
			if in.paid {
				res.Paid++
			}
			n := charges[in.ID]
			if n > 1 {
				res.Duplicates++
			}
			if n == 1 {
				res.ChargedOnce++
				if k := chargeKey[in.ID]; k != "" && k == firstKey[in.ID] {
					res.OriginalKey++
					if in.parked {
						res.ParkedChargedOnce++
					}
				}
			}
		}
	}
	return res
}
