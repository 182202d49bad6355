package idemretry

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// stillClock is a Clock that reads now until moved.
type stillClock struct{ now time.Time }

func (c *stillClock) Now() time.Time  { return c.now }
func (c *stillClock) NewTimer() Timer { return systemClock{}.NewTimer() }

var lifeT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// The journal transitions of an action's record, as one reservation makes
// them (lifecycle.go's first table), for each kind of request: which
// record it reserves (a new one, or the one found), and what the journal
// holds after it.
func TestLifecycleReserveTransitions(t *testing.T) {
	t.Parallel()
	const window = 24 * time.Hour
	type kind uint8
	const (
		unnamed kind = iota
		named
		resumed
		bound
		// sdkKeyed: named, its request carrying a key of its own (as an
		// SDK that mints one per call sets it), not the found record's.
		sdkKeyed
	)
	const sdkKey = "sdk-key-of-this-call"
	cases := []struct {
		name   string
		kind   kind
		found  journal.State // 0: no record
		age    time.Duration // of the record found, when the request comes
		dupWin time.Duration
		// want: the reservation's refusal (nil: the request is sent), and
		// whether it sends under the found record's key.
		refused error
		sameKey bool
		after   journal.State // the record's state once reserved
	}{
		{"absent -> pending", unnamed, 0, 0, 0, nil, false, journal.StatePending},
		{"absent -> pending (named)", named, 0, 0, 0, nil, false, journal.StatePending},
		{"absent -> pending: a named request's own key adopted", sdkKeyed, 0, 0, 0, nil, false, journal.StatePending},
		{"pending: a tap of it, under its key", unnamed, journal.StatePending, time.Minute, 0, nil, true, journal.StatePending},
		{"pending: a named resend", named, journal.StatePending, time.Hour, 0, nil, true, journal.StatePending},
		{"pending: a named resend with a key of its own, under the action's", sdkKeyed, journal.StatePending, time.Hour, 0, nil, true, journal.StatePending},
		{"done -> pending: an unnamed repeat is a new action", unnamed, journal.StateDone, time.Second, 0, nil, false, journal.StatePending},
		{"done: an unnamed repeat within the duplicate window", unnamed, journal.StateDone, 5 * time.Second, 30 * time.Second, nil, true, journal.StateDone},
		{"done -> pending: an unnamed repeat past the duplicate window", unnamed, journal.StateDone, 65 * time.Second, 30 * time.Second, nil, false, journal.StatePending},
		{"done: a named resend gets its replay", named, journal.StateDone, time.Hour, 0, nil, true, journal.StateDone},
		{"done: a named resend with a key of its own gets its replay", sdkKeyed, journal.StateDone, time.Hour, 0, nil, true, journal.StateDone},
		{"done: Resume resends it under its key", resumed, journal.StateDone, time.Hour, 0, nil, true, journal.StateDone},
		{"done: a joiner carrying it on resends it under its key", bound, journal.StateDone, time.Hour, 0, nil, true, journal.StateDone},
		{"pending -> unknown: past its key window", named, journal.StatePending, window + time.Second, 0, ErrKeyWindowExpired, true, journal.StateUnknown},
		{"pending -> unknown: Resume past its key window", resumed, journal.StatePending, window + time.Second, 0, ErrKeyWindowExpired, true, journal.StateUnknown},
		{"unknown: never sent", unnamed, journal.StateUnknown, time.Hour, 0, ErrOutcomeUnknown, true, journal.StateUnknown},
		{"unknown: never sent, past its window", named, journal.StateUnknown, window + time.Hour, 0, ErrKeyWindowExpired, true, journal.StateUnknown},
		{"done past its window: a named resend is refused", named, journal.StateDone, window + time.Hour, 0, ErrKeyWindowExpired, true, journal.StateDone},
		{"pending created in the clock's future", named, journal.StatePending, -2 * time.Minute, 0, ErrClockSkew, true, journal.StatePending},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := journal.NewMemory()
			clk := &stillClock{now: lifeT0}
			opts := []Option{WithJournal(j), WithClock(clk)}
			if tc.dupWin > 0 {
				opts = append(opts, WithDuplicateWindow(tc.dupWin))
			}
			tr, err := NewTransport(nil, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ctx := context.Background()
			if tc.kind != unnamed {
				ctx = WithAction(ctx, "pay:life")
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.example/charges", strings.NewReader(`{"amount":1}`))
			if err != nil {
				t.Fatal(err)
			}
			if tc.kind == sdkKeyed {
				req.Header.Set("Idempotency-Key", sdkKey)
			}
			b, err := newBody(req, tr.cfg.maxBuffered)
			if err != nil {
				t.Fatal(err)
			}
			who, err := tr.identify(req, &b)
			if err != nil {
				t.Fatal(err)
			}
			if tc.kind != unnamed && who.id != "pay:life" {
				t.Fatalf("identified as %q, want the WithAction id", who.id)
			}
			var old journal.Record
			if tc.found != 0 {
				old = journal.Record{ActionID: who.id, Key: "0b9d3e55-5a6b-4c1f-9a3e-3f1c2d4e5f60", Fingerprint: who.fp,
					CreatedAt: lifeT0.Add(-tc.age), State: tc.found, Attempts: 1}
				if tc.found == journal.StateDone {
					old.Status = http.StatusCreated
				}
				if _, _, err := j.Reserve(context.Background(), old, journal.ReuseAny); err != nil {
					t.Fatal(err)
				}
				switch tc.kind {
				case resumed:
					who.resumed = &resumeMark{rec: old}
				case bound:
					who.bound = &old
				}
			}
			var dst action
			a, err := tr.reserve(context.Background(), who, payload{req, &b}, window, &dst)
			switch {
			case tc.refused != nil && !errors.Is(err, tc.refused):
				t.Fatalf("reserve: %v, want %v", err, tc.refused)
			case tc.refused == nil && err != nil:
				t.Fatalf("reserve: %v", err)
			case tc.refused == nil && (a.rec.Key == old.Key) != tc.sameKey:
				t.Fatalf("sent under key %s, found %s: same %v, want %v", a.rec.Key, old.Key, a.rec.Key == old.Key, tc.sameKey)
			case tc.refused == nil && tc.kind == sdkKeyed && tc.found == 0 && a.rec.Key != sdkKey:
				t.Fatalf("a new action reserved key %s, want the request's own %s", a.rec.Key, sdkKey)
			}
			recs, err := j.Unfinished(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			state := journal.StateDone
			for _, r := range recs {
				if r.ActionID == who.id {
					state = r.State
					if (r.Key == old.Key) != tc.sameKey {
						t.Fatalf("the journal holds key %s, found %s: same %v, want %v", r.Key, old.Key, r.Key == old.Key, tc.sameKey)
					}
				}
			}
			if state != tc.after {
				t.Fatalf("the record is %v after the reservation, want %v", state, tc.after)
			}
		})
	}
}

// reservedFlight is a landed flight whose first reservation found rec,
// handed over (again), bound to its action or not.
func reservedFlight(rec journal.Record, again, bound bool) *flight {
	f := &flight{again: again, bound: bound}
	var fs flights
	fs.noteFound(f, rec, false)
	return f
}

// What a request that joined a flight does once it has landed (landed):
// it takes the result only if the flight's action is one it would itself
// have reserved, judged by what the flight's reservation found.
func TestLifecycleJoinVerdicts(t *testing.T) {
	t.Parallel()
	const dup = 30 * time.Second
	pending := journal.Record{Key: "k1", State: journal.StatePending, CreatedAt: lifeT0}
	done := journal.Record{Key: "k1", State: journal.StateDone, Status: 201, CreatedAt: lifeT0}
	unknown := journal.Record{Key: "k1", State: journal.StateUnknown, CreatedAt: lifeT0}
	unnamed := identity{byFingerprint: true}
	named := identity{}
	resumedK1 := identity{byFingerprint: true, resumed: &resumeMark{rec: done}}
	resumedK2 := identity{byFingerprint: true, resumed: &resumeMark{rec: journal.Record{Key: "k2"}}}
	boundK1 := identity{byFingerprint: true, bound: &done}
	cases := []struct {
		name    string
		who     identity
		f       *flight
		arrived time.Duration // after the found record's creation
		window  time.Duration
		hopLive bool // a done 307/308's hop was unfinished on arrival
		want    joinVerdict
	}{
		{"handed over, its action reserved: carry it on", unnamed, reservedFlight(pending, true, true), 0, 0, false, carryOn},
		{"handed over before reserving: go again", unnamed, &flight{again: true}, 0, 0, false, goAgain},
		{"handed over unbound (Resume refused): go again", unnamed, reservedFlight(pending, true, false), 0, 0, false, goAgain},
		{"handed over, a done action, a payment after the window: a new payment", unnamed, reservedFlight(done, true, true), 65 * time.Second, dup, false, goAgain},
		{"handed over, a done action, a tap within the window: carry it on", unnamed, reservedFlight(done, true, true), 5 * time.Second, dup, false, carryOn},
		{"handed over, Resume of another key", resumedK2, reservedFlight(pending, true, true), 0, 0, false, goAgain},
		{"refused before any record: take the refusal", unnamed, &flight{}, 0, 0, false, takeResult},
		{"a tap of a pending action", unnamed, reservedFlight(pending, false, false), time.Hour, 0, false, takeResult},
		{"a tap of a done action within the window", unnamed, reservedFlight(done, false, false), 5 * time.Second, dup, false, takeResult},
		{"a payment after the window", unnamed, reservedFlight(done, false, false), 65 * time.Second, dup, false, goAgain},
		{"a payment after a done action, no window", unnamed, reservedFlight(done, false, false), time.Second, 0, false, goAgain},
		{"a named action's resend of a done action", named, reservedFlight(done, false, false), time.Hour, 0, false, takeResult},
		{"an outcome-unknown action: take its refusal", unnamed, reservedFlight(unknown, false, false), time.Hour, 0, false, takeResult},
		{"Resume of the flight's action", resumedK1, reservedFlight(done, false, false), time.Hour, 0, false, takeResult},
		{"Resume of another key", resumedK2, reservedFlight(pending, false, false), 0, 0, false, goAgain},
		{"a joiner carrying on the flight's action", boundK1, reservedFlight(done, false, false), time.Hour, 0, false, takeResult},
		{"a joiner carrying on another action", boundK1, reservedFlight(journal.Record{Key: "k3", State: journal.StatePending}, false, false), 0, 0, false, goAgain},
		{"a tap of a done 307 whose hop was unfinished on arrival", unnamed, reservedFlight(done, false, false), time.Second, 0, true, takeResult},
		{"a payment after a done 307 whose hop had finished on arrival", unnamed, reservedFlight(done, false, false), time.Second, 0, false, goAgain},
		{"handed over, a done 307 whose hop was unfinished on arrival: carry it on", unnamed, reservedFlight(done, true, true), time.Second, 0, true, carryOn},
	}
	for _, tc := range cases {
		if got := landed(&tc.who, tc.f, lifeT0.Add(tc.arrived), tc.hopLive, tc.window); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Whether a flight's leader hands the action over to its joiners
// (handsOver): only for a reason of its own.
func TestLifecycleHandOver(t *testing.T) {
	t.Parallel()
	const live, ended = false, true
	final := &http.Response{StatusCode: 201}
	cases := []struct {
		name    string
		ended   bool // the leader's caller ended it
		who     identity
		resp    *http.Response
		err     error
		pending bool
		want    bool
	}{
		{"a final answer", live, identity{}, final, nil, false, false},
		{"a final answer as the leader's context ends", ended, identity{}, final, nil, false, false},
		{"unfinished: the leader's caller ended it", ended, identity{}, nil, context.Canceled, true, true},
		{"unfinished: retries exhausted after the leader's caller ended it", ended, identity{}, nil, ErrAttemptsExhausted, true, true},
		{"unfinished: the leader's deadline cut the retries", live, identity{}, nil, ErrWaitExceedsDeadline, true, true},
		{"unfinished: attempts exhausted, shared", live, identity{}, nil, ErrAttemptsExhausted, true, false},
		{"Resume's listed key is not the action's", live, identity{resumed: &resumeMark{}}, nil, &ActionError{Reason: ErrNotResumable}, false, true},
		{"a live request refused as not resumable does not hand over", live, identity{}, nil, &ActionError{Reason: ErrNotResumable}, false, false},
	}
	for _, tc := range cases {
		if got := handsOver(tc.ended, &tc.who, tc.resp, tc.err, tc.pending); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The unnamed request's rule of new or repeat (repeats).
func TestLifecycleRepeats(t *testing.T) {
	t.Parallel()
	rec := func(s journal.State) journal.Record { return journal.Record{State: s, CreatedAt: lifeT0} }
	cases := []struct {
		name   string
		rec    journal.Record
		at     time.Duration
		window time.Duration
		want   bool
	}{
		{"pending", rec(journal.StatePending), time.Hour, 0, true},
		{"unknown", rec(journal.StateUnknown), time.Hour, 0, true},
		{"done, no window", rec(journal.StateDone), 0, 0, false},
		{"done, within the window", rec(journal.StateDone), 29 * time.Second, 30 * time.Second, true},
		{"done, at the window's end", rec(journal.StateDone), 30 * time.Second, 30 * time.Second, false},
		{"done, past the window", rec(journal.StateDone), 65 * time.Second, 30 * time.Second, false},
	}
	for _, tc := range cases {
		if got := repeats(tc.rec, lifeT0.Add(tc.at), tc.window); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// When Resume may resolve an outcome-unknown action (settled): from the
// settle time after its key window, not before.
func TestLifecycleSettled(t *testing.T) {
	t.Parallel()
	const window, settle = 24 * time.Hour, time.Minute
	listed := journal.Record{ActionID: "pay:settle", Key: "k1", State: journal.StateUnknown, CreatedAt: lifeT0}
	cases := []struct {
		name string
		at   time.Duration
		want error
	}{
		{"within its key window", time.Hour, ErrOutcomeUnknown},
		{"its window just ended, the settle time not", window + time.Second, ErrOutcomeUnknown},
		{"at the settle time's end", window + settle, nil},
		{"long after", window + time.Hour, nil},
	}
	for _, tc := range cases {
		if got := settled(listed, lifeT0.Add(tc.at), window, settle); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A flight's leader is ended by its caller through its context or the
// deprecated Request.Cancel channel (leaderEnded).
func TestLifecycleLeaderEnded(t *testing.T) {
	t.Parallel()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan struct{})
	close(closed)
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		cancel chan struct{}
		want   bool
	}{
		{"live", context.Background(), nil, false},
		{"its context ended", ended, nil, true},
		{"its Cancel channel open", context.Background(), make(chan struct{}), false},
		{"its Cancel channel closed", context.Background(), closed, true},
	} {
		req, err := http.NewRequestWithContext(tc.ctx, http.MethodPost, "http://pay.example/charges", nil)
		if err != nil {
			t.Fatal(err)
		}
		//lint:ignore SA1019 the deprecated channel is what is tested
		req.Cancel = tc.cancel
		if got := leaderEnded(req); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
