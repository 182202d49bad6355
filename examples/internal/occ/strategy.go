package occ

import (
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/examples/internal/backoffs"
)

// The reference simulator's backoff settings. It numbers the first retry
// n = 1, so its first ceiling is 2*RefBase = 10 ms; idemretry numbers it
// n = 0 (ceiling = Base), so the exponential strategies get LibBase to land
// on the same ceilings 10, 20, 40 ... 2000 ms. Getting this wrong by one
// doubling moves FullJitter's calls by about 10%.
const (
	RefBase = 5 * time.Millisecond
	LibBase = 2 * RefBase
	Cap     = 2000 * time.Millisecond
)

// A Strategy is one backoff policy under test.
type Strategy struct {
	// Name is the reference CSV's label for it.
	Name string
	// New returns a fresh backoff for one client of one run, drawing from r.
	New func(r idemretry.Random) backoff.BackOff
}

// Strategies returns the five policies of the reference, in its CSV's
// (alphabetical) order. FullJitter is idemretry's own type, never a copy of
// the formula, so the simulation tests the library; the others are the
// comparison backoffs of package backoffs.
func Strategies() []Strategy {
	return []Strategy{
		{"Decorr", func(r idemretry.Random) backoff.BackOff {
			// The decorrelated formula grows from the previous sleep, not
			// from n, so it takes the reference's own base: sleep0 = 5 ms,
			// then min(Cap, U(5 ms, 3*sleep)).
			return backoffs.NewDecorrelatedJitter(RefBase, Cap, r)
		}},
		{"EqualJitter", func(r idemretry.Random) backoff.BackOff {
			return backoffs.NewEqualJitter(LibBase, Cap, r)
		}},
		{"Exponential", func(idemretry.Random) backoff.BackOff {
			return backoffs.NewExponential(LibBase, Cap)
		}},
		{"FullJitter", func(r idemretry.Random) backoff.BackOff {
			return idemretry.NewFullJitter(LibBase, Cap, r)
		}},
		{"None", func(idemretry.Random) backoff.BackOff {
			return &backoff.ZeroBackOff{}
		}},
	}
}

// StrategyNames returns the labels of Strategies, in the same order.
func StrategyNames() []string {
	var names []string
	for _, s := range Strategies() {
		names = append(names, s.Name)
	}
	return names
}
