package payments

import (
	"fmt"
	"strings"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/examples/internal/backoffs"
)

// Strategy is a backoff the clients wait with between attempts. Each one
// takes the library's defaults (DefaultBaseDelay, DefaultMaxDelay);
// FullJitter is the library's own type, so the simulation shows the
// Transport as it ships, and the others are package backoffs' comparison
// backoffs.
type Strategy struct {
	Name string
	New  func(r idemretry.Random) backoff.BackOff
}

// Strategies in the order the tables and the plot show them.
var Strategies = []Strategy{
	{"FullJitter", func(r idemretry.Random) backoff.BackOff {
		return idemretry.NewFullJitter(idemretry.DefaultBaseDelay, idemretry.DefaultMaxDelay, r)
	}},
	{"EqualJitter", func(r idemretry.Random) backoff.BackOff {
		return backoffs.NewEqualJitter(idemretry.DefaultBaseDelay, idemretry.DefaultMaxDelay, r)
	}},
	{"Decorr", func(r idemretry.Random) backoff.BackOff {
		return backoffs.NewDecorrelatedJitter(idemretry.DefaultBaseDelay, idemretry.DefaultMaxDelay, r)
	}},
	{"Exponential", func(idemretry.Random) backoff.BackOff {
		return backoffs.NewExponential(idemretry.DefaultBaseDelay, idemretry.DefaultMaxDelay)
	}},
	// None retries at once: the library has no type for it because nobody
	// should ship it; cenkalti's ZeroBackOff is exactly that.
	{"None", func(idemretry.Random) backoff.BackOff { return &backoff.ZeroBackOff{} }},
}

// ParseStrategies resolves a comma-separated list of names ("all" for
// every strategy), case-insensitively.
func ParseStrategies(list string) ([]Strategy, error) {
	if strings.EqualFold(strings.TrimSpace(list), "all") {
		return Strategies, nil
	}
	var out []Strategy
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, s := range Strategies {
			if strings.EqualFold(s.Name, name) {
				out, found = append(out, s), true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown strategy %q", name)
		}
	}
	return out, nil
}
