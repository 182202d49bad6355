package payments

import (
	"time"

	"github.com/idemretry/idemretry/journal"
)

// Config is one run: one flavour, one strategy, one population of clients.
// Durations are virtual time.
type Config struct {
	Seed     int64
	Flavour  Flavour
	Strategy Strategy
	Scale    float64 // virtual time runs Scale times faster than the wall clock

	Clients int // client processes
	Intents int // payments per client, made one after another
	// Each client starts at U(0, StartSpread) and pauses ThinkTime between
	// payments.
	StartSpread, ThinkTime time.Duration

	// Server.
	Outage                 Outage
	Capacity, WarmCapacity int
	ProcessTime, SlowTime  time.Duration
	DropRate, SlowRate     float64 // shares of intents whose first processing is dropped / slow

	// AttemptTimeout is how long a client waits for an attempt's answer.
	AttemptTimeout time.Duration

	// Restart phase: Crashers clients are killed once, right after the
	// server commits one of their payments and before it answers, and
	// restarted RestartDelay later over the same journal directory.
	Crashers     int
	RestartDelay time.Duration

	// JournalDir holds one journal directory per client for FileJournal.
	JournalDir string

	// WrapJournal, if set, wraps the journal of every process of flavours
	// 3 and 4 before its Transport uses it. It is a seam for tests that
	// break the journal on purpose (one that forgets its records, say) to
	// show that the scenario's checks catch it. Nil in the real scenario.
	WrapJournal func(journal.Journal) journal.Journal
}

// StormConfig is the first phase: answers lost after commit, slow charges
// that outlive the client's timeout, an outage of fast 503s with a warm-up,
// and a capacity limit answered with 429 + Retry-After. Nobody crashes.
func StormConfig(seed int64) Config {
	return Config{
		Seed: seed, Scale: 10,
		Clients: 60, Intents: 6,
		StartSpread: 100 * time.Millisecond, ThinkTime: 10 * time.Millisecond,
		Outage:   Outage{Start: 200 * time.Millisecond, End: 3200 * time.Millisecond, WarmUp: time.Second},
		Capacity: 24, WarmCapacity: 6,
		ProcessTime: 20 * time.Millisecond, SlowTime: 4 * time.Second,
		DropRate: 0.04, SlowRate: 0.04,
		// Long enough that a stall of the shared machine (a tenth of it in
		// wall time) is not mistaken for a slow charge.
		AttemptTimeout: 2 * time.Second,
	}
}

// RestartConfig is the restart phase: no faults at all but the crashes, so
// that every duplicate it shows is caused by a restart alone.
func RestartConfig(seed int64) Config {
	c := StormConfig(seed)
	c.Outage = Outage{}
	c.DropRate, c.SlowRate = 0, 0
	c.Crashers = c.Clients / 5
	c.RestartDelay = 200 * time.Millisecond
	// No attempt should time out either: a stalled machine must not add
	// duplicates the restarts did not cause.
	c.AttemptTimeout = 30 * time.Second
	return c
}
