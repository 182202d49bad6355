package payments

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// Fault is what the server does to one processing of a charge.
type Fault int

const (
	// NoFault: process normally and answer.
	NoFault Fault = iota
	// Drop: commit the charge, then cut the connection before answering,
	// as when the answer is lost on the way back.
	Drop
	// Slow: take SlowTime to process, so that the client times out and its
	// retry arrives while the first request is still in flight; the first
	// request's answer then goes to a client that gave up on it.
	Slow
	// Error500: fail without charging and answer 500 (stored and replayed
	// like any other answer under a key).
	Error500
)

// FaultPlan decides the fault of the n-th processing (from 0) of an intent.
// Deciding per intent and processing, never by arrival time, keeps the
// faults the same across flavours, strategies and timing noise.
type FaultPlan func(intent string, n int) Fault

// RandomFaults returns a plan that drops the first processing of a share
// drop of the intents and slows the first processing of a share slow, chosen
// by a hash of seed and intent id. Later processings are never faulted, so
// each faulted intent costs a keyless client exactly one extra charge.
func RandomFaults(seed int64, drop, slow float64) FaultPlan {
	return func(intent string, n int) Fault {
		if n > 0 {
			return NoFault
		}
		u := unitHash(seed, "fault", intent)
		switch {
		case u < drop:
			return Drop
		case u < drop+slow:
			return Slow
		}
		return NoFault
	}
}

// unitHash maps (seed, parts) to [0, 1), the same on every run.
func unitHash(seed int64, parts ...string) float64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(seed) >> (8 * i))
	}
	h.Write(b[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return float64(splitmix(h.Sum64())>>11) / (1 << 53)
}

// splitmix is SplitMix64's finaliser: nearby inputs, unrelated outputs.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Outage is a window of virtual time (from the run's start) in which the
// server answers every request with a fast 503, followed by a warm-up in
// which it still sheds load above a reduced capacity with 503s.
type Outage struct {
	Start, End time.Duration // hard down in [Start, End)
	WarmUp     time.Duration // reduced capacity in [End, End+WarmUp)
}

func (o Outage) down(t time.Duration) bool { return t >= o.Start && t < o.End }

func (o Outage) warming(t time.Duration) bool {
	return o.End > o.Start && t >= o.End && t < o.End+o.WarmUp
}

// Forgetful wraps j in a broken journal that forgets an action's record
// before every Reserve, so each RoundTrip mints a new key, while Unfinished
// still lists what a crashed process left pending. The tests play with it
// to show that the checks read the server's ledger, not the app's word.
func Forgetful(j journal.Journal) journal.Journal { return forgetful{j} }

type forgetful struct{ journal.Journal }

func (j forgetful) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if err := j.Journal.Forget(ctx, rec.ActionID); err != nil {
		return journal.Record{}, false, err
	}
	return j.Journal.Reserve(ctx, rec, mode)
}
