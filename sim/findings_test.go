package sim

import (
	"strings"
	"testing"
)

// A finding is a history the simulator found breaking a check, shrunk,
// kept as a plain test once its cause is fixed: the seed draws the
// history, ops keeps the steps the shrinker left (as IDEMRETRY_SIM_OPS
// does).
type finding struct {
	name string
	seed uint64
	ops  string
}

// findings: the histories the simulator found, each by what it showed.
// Goroutines interleave differently from run to run, so each runs several
// times; the figure in each comment is how often it failed before its fix.
var findings = []finding{
	// An unnamed quadruple tap, after a payment of the same body was done:
	// the leader's context ended in a slow Reserve, its joiners were woken
	// to go again each on its own, and one that boarded after another had
	// finished found that one's payment done and made a second (8 of 10
	// runs before the flight that goes on from a landed one: flights.land
	// and heir).
	{"woken-joiners-are-one-tap", 1796185515861680192, "13,24,27,29"},
	// An unnamed payment made again while Resume resent the first, done:
	// it joined the resend's flight, went again when it landed, and before
	// it boarded again a tap of it started a flight of its own, paid, and
	// landed; the repeat, boarding late, found that payment done and made
	// a second (about 1 run in 10 before the flight that goes on from a
	// landed one, flights.land and heir).
	{"joiners-that-go-again-are-one-tap", 1796193128802255514, "12,14,15,16,17,19,20,21,22,24,25"},
	// A tap within the duplicate window whose Reserve was slow while the
	// clock was set forward past the window: judged at its reservation, it
	// was made a second payment (10 of 10 runs before the window was
	// judged at the tap's arrival, identity.arrived).
	{"duplicate-window-at-arrival", 1796194081436358101, "7,14,16,18,21"},
	// Taps within the duplicate window after the clock was set back 5
	// minutes, taken for payments made after them (a lower bound on the
	// window read off the wall clock): charged twice (60 violations in one
	// 40 s CI run, before the bound was read off the journal's kept time
	// alone, identity.repeatsOnArrival).
	{"duplicate-window-clock-set-back", 1796197290126201330, "3,4,6,7,8,12,13,17"},
}

// runs is how often each finding's history runs.
const runs = 30

// TestLifecycleFindings runs each finding's history again and requires
// that none of its checks is broken.
func TestLifecycleFindings(t *testing.T) {
	db := testDB(t)
	if db != nil {
		defer db.Close()
	}
	e := env{dir: t.TempDir(), db: db}
	for _, f := range findings {
		t.Run(f.name, func(t *testing.T) {
			h, err := generate(f.seed, genFor(db)).keep(f.ops)
			if err != nil {
				t.Fatal(err)
			}
			for run := range runs {
				o := runHistory(h, e)
				if o.err != nil {
					t.Fatalf("run %d: %v", run, o.err)
				}
				for _, v := range o.viol {
					t.Errorf("run %d: %s: %s [%s]", run, v.check, v.msg, strings.Join(v.tags, ", "))
				}
				if t.Failed() {
					t.Logf("history:\n%s", h)
					return
				}
			}
		})
	}
}
