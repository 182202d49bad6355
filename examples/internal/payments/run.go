package payments

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// run is the state of one Run.
type run struct {
	cfg     Config
	ctx     context.Context
	clock   *Clock
	epoch   time.Time
	server  *Server
	intents [][]*Intent // per client

	crashAt      sync.Map                 // intent id -> client, removed when it fires
	kill         []atomic.Pointer[func()] // per client: kills its current process
	crashes      atomic.Int64             // processes killed
	resumed      atomic.Int64             // actions a restarted journal listed as unfinished
	plannedKills int                      // processes pickCrashes chose to kill
	errMu        sync.Mutex
	err          error
}

// Run plays one configuration to the end and measures it.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Flavour == FileJournal && cfg.JournalDir == "" {
		return nil, errors.New("payments: FileJournal needs a JournalDir")
	}
	wall := time.Now()
	clk := NewClock(cfg.Scale)
	r := &run{cfg: cfg, ctx: ctx, clock: clk, epoch: clk.Now()}
	r.kill = make([]atomic.Pointer[func()], cfg.Clients)
	for c := range cfg.Clients {
		var row []*Intent
		for i := range cfg.Intents {
			row = append(row, newIntent(c, i))
		}
		r.intents = append(r.intents, row)
	}
	r.pickCrashes()

	var faults FaultPlan
	if cfg.DropRate > 0 || cfg.SlowRate > 0 {
		faults = RandomFaults(cfg.Seed, cfg.DropRate, cfg.SlowRate)
	}
	r.server = NewServer(ServerConfig{
		Clock: clk, Epoch: r.epoch, Faults: faults, Outage: cfg.Outage,
		Capacity: cfg.Capacity, WarmCapacity: cfg.WarmCapacity,
		ProcessTime: cfg.ProcessTime, SlowTime: cfg.SlowTime,
		OnCommit: r.onCommit,
	})
	// Every client process starts (Transport, journal) before the clock of
	// the run starts: at ten times speed, sixty start-ups on two cores
	// would otherwise eat the calm before the outage.
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	for c := range cfg.Clients {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			r.client(c, ready.Done, start)
		}()
	}
	ready.Wait()
	r.epoch = clk.Now()
	r.server.SetEpoch(r.epoch)
	stalls := watchStalls()
	close(start)
	wg.Wait()
	r.server.Close() // waits for slow handlers still answering nobody
	stall := stalls.finish()
	if r.err != nil {
		return nil, r.err
	}
	res := r.measure()
	res.Wall, res.Stall, res.StallLimit = time.Since(wall), clk.Virtual(stall), cfg.StallLimit()
	return res, ctx.Err()
}

// pickCrashes chooses which clients die, and during which payment: the
// same for every flavour and strategy of a seed.
func (r *run) pickCrashes() {
	rng := rand.New(rand.NewPCG(uint64(r.cfg.Seed), 0xc4a54))
	for _, c := range rng.Perm(r.cfg.Clients)[:min(r.cfg.Crashers, r.cfg.Clients)] {
		in := r.intents[c][rng.IntN(r.cfg.Intents)]
		r.crashAt.Store(in.ID, c)
		r.plannedKills++
	}
}

// onCommit kills a chosen client right after the server committed its
// payment: the worst moment, when the charge is made and the answer is not
// yet sent. The server then cuts the connection.
func (r *run) onCommit(intent string) bool {
	c, ok := r.crashAt.LoadAndDelete(intent)
	if !ok {
		return false
	}
	if kill := r.kill[c.(int)].Load(); kill != nil {
		(*kill)()
	}
	return true
}

// client runs one client: payments in order, one process after another if
// it is killed. Its order list is the application's own durable state (an
// orders table): after a restart it re-issues every payment not confirmed.
//
// ready is called once the first process has started; the client then
// waits for start.
func (r *run) client(c int, ready func(), start <-chan struct{}) {
	name := fmt.Sprintf("client-%03d", c)
	rng := rand.New(rand.NewPCG(uint64(r.cfg.Seed), uint64(c)+1))
	pending := r.intents[c]
	for life := 0; len(pending) > 0 && r.ctx.Err() == nil; life++ {
		ctx, cancel := context.WithCancel(r.ctx)
		kill := func() { cancel() }
		r.kill[c].Store(&kill)
		p, err := r.newPayer(c, name, life, rng)
		if life == 0 {
			ready()
			<-start
			r.clock.Sleep(time.Duration(rng.Int64N(int64(r.cfg.StartSpread) + 1)))
		}
		if err != nil {
			cancel()
			r.fail(fmt.Errorf("%s: start: %w", name, err))
			return
		}
		if kp, ok := p.(*keyedPayer); ok && life > 0 {
			if recs, err := kp.unfinished(ctx); err == nil {
				r.resumed.Add(int64(len(recs)))
			}
		}
		for len(pending) > 0 {
			in := pending[0]
			if in.start.IsZero() {
				in.start = r.clock.Now()
			}
			ok := p.pay(ctx, in)
			if ctx.Err() != nil {
				break // killed (or the whole run stopped)
			}
			in.ok, in.end = ok, r.clock.Now()
			pending = pending[1:]
			r.clock.Sleep(r.cfg.ThinkTime)
		}
		r.kill[c].Store(nil)
		if ctx.Err() == nil || r.ctx.Err() != nil {
			cancel()
			if err := p.close(); err != nil {
				r.fail(fmt.Errorf("%s: close: %w", name, err))
			}
			return
		}
		// Killed mid-payment: the process is gone; a new one starts later.
		pending[0].crashed = true
		p.crash()
		cancel()
		r.crashes.Add(1)
		r.clock.Sleep(r.cfg.RestartDelay)
	}
}

func (r *run) newPayer(c int, name string, life int, rng *rand.Rand) (payer, error) {
	cfg := r.cfg
	switch cfg.Flavour {
	case Naive, KeyPerAttempt:
		return newLoopPayer(cfg.Flavour, r.server.URL(), name, life, cfg.Strategy, rng, r.clock, cfg.AttemptTimeout), nil
	case MemoryKey, FileJournal:
		dir := filepath.Join(cfg.JournalDir, name)
		if cfg.Flavour == FileJournal {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, err
			}
		}
		return newKeyedPayer(cfg.Flavour, r.server.URL(), name, dir, cfg.Strategy, rng, r.clock, cfg.AttemptTimeout, cfg.WrapJournal)
	}
	return nil, fmt.Errorf("unknown flavour %d", cfg.Flavour)
}

func (r *run) fail(err error) {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if r.err == nil {
		r.err = err
	}
}
