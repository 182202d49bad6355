package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// The Resumer rebuilds an unnamed action from the id the Transport gave
// it; the simulation computes that id as fingerprint.go does, and this test
// holds it to the Transport's.
func TestFingerprintIDMatchesTheTransport(t *testing.T) {
	j := journal.NewMemory()
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		return &http.Response{StatusCode: 503, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithMaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	url := "http://pay.sim" + payPath
	for _, b := range bodies {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(b)))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	recs, err := j.Unfinished(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, b := range bodies {
		want[fingerprintID(url, b)] = true
	}
	if len(recs) != len(bodies) {
		t.Fatalf("%d unfinished actions, want %d", len(recs), len(bodies))
	}
	for _, rec := range recs {
		if !want[rec.ActionID] {
			t.Errorf("the Transport named an unnamed payment %s, which the simulation's fingerprintID does not give for any body", rec.ActionID)
		}
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestHistoriesAreDrawnFromTheirSeed(t *testing.T) {
	g := genConfig{sql: true, loopback: 10, file: 30, sqlShare: 10, maxOps: 40}
	for seed := uint64(1); seed < 50; seed++ {
		a, b := generate(seed, g).String(), generate(seed, g).String()
		if a != b {
			t.Fatalf("seed %d drew two histories:\n%s\n%s", seed, a, b)
		}
	}
	if generate(1, g).String() == generate(2, g).String() {
		t.Fatal("seeds 1 and 2 drew the same history")
	}
}

func TestFaultPlanIsAFunctionOfCallAndAttempt(t *testing.T) {
	p, q := generate(7, genConfig{maxOps: 10}).faults, generate(7, genConfig{maxOps: 10}).faults
	kinds := map[faultKind]bool{}
	for c := 1; c < 50; c++ {
		for a := 1; a < 6; a++ {
			f := p.draw(c, a)
			if g := q.draw(c, a); f != g {
				t.Fatalf("call %d attempt %d drew %v and %v", c, a, f, g)
			}
			kinds[f.kind] = true
		}
	}
	if len(kinds) < 3 {
		t.Fatalf("250 draws gave %d kinds of fault", len(kinds))
	}
}

func TestShrinkFindsAMinimalHistory(t *testing.T) {
	h := generate(11, genConfig{maxOps: 40})
	h.ops = append(h.ops, op{kind: opCrash}, op{kind: opPay, callers: 2}, op{kind: opResume})
	// "Fails" while a crash is followed, later, by a Resume.
	still := func(c *history) bool {
		crashed := false
		for _, o := range c.ops {
			if o.kind == opCrash {
				crashed = true
			}
			if o.kind == opResume && crashed {
				return true
			}
		}
		return false
	}
	got := shrinkWith(h, still, 10*time.Second)
	if len(got.ops) != 2 || got.ops[0].kind != opCrash || got.ops[1].kind != opResume {
		t.Fatalf("shrunk to %d steps, want crash then resume:\n%s", len(got.ops), got)
	}
}

func TestVirtualTimersFireAtOnceAndMoveTrueTime(t *testing.T) {
	c := &vclock{}
	c.SetOffset(-time.Hour)
	tm := c.NewTimer()
	start := time.Now()
	tm.Start(3 * time.Hour)
	<-tm.C()
	if real := time.Since(start); real > time.Second {
		t.Fatalf("a virtual wait of 3 h took %v of real time", real)
	}
	if got := c.trueSince(); got != 3*time.Hour {
		t.Fatalf("true time %v after a 3 h wait, want 3h", got)
	}
	if got := c.Now().Sub(c.TrueNow()); got != -time.Hour {
		t.Fatalf("wall clock %v off true time, want -1h", got)
	}
}

// A call's context is first asked for its Done channel once the Transport
// has chosen to lead or to join a flight: the tap gate relies on it.
func TestProbeSeesTheFlightChoice(t *testing.T) {
	rec := &recorder{}
	c := &call{joined: make(chan struct{})}
	ctx := &probeCtx{Context: context.WithValue(context.Background(), callCtxKey{}, c), c: c, rec: rec}
	srv := rtFunc(func(r *http.Request) (*http.Response, error) {
		if c.joinSeq.Load() == 0 {
			return nil, errors.New("the request left before Done was asked for")
		}
		r.Body.Close()
		return &http.Response{StatusCode: 201, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})
	tr, err := idemretry.NewTransport(srv, idemretry.WithJournal(journal.NewMemory()))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.sim/v1/payments", strings.NewReader("x"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case <-c.joined:
	default:
		t.Fatal("the probe never saw the flight chosen")
	}
}

// A history whose journal would not open because the database did not
// answer (journal.ErrUnavailable, as a loaded machine's PostgreSQL gives)
// is counted apart; any other failure to run one is an error of the
// simulation. (CI, at a load average of 25: "open journal: sqljournal:
// table ...: journal unavailable: ... i/o timeout" failed TestLifecycle.)
func TestUnavailableDatabaseIsCountedApart(t *testing.T) {
	var s stats
	h := &history{seed: 7, jk: sqlJournal, machines: 1}
	s.add(outcome{h: h, err: fmt.Errorf("open journal: sqljournal: %w: i/o timeout", journal.ErrUnavailable)})
	s.add(outcome{h: h, err: errors.New("open journal: table has no column key_form")})
	s.add(outcome{h: h})
	if s.unavailable != 1 || !strings.Contains(s.unavailableMsg, "seed 7: open journal") {
		t.Errorf("unavailable = %d (%q), want 1, seed 7's", s.unavailable, s.unavailableMsg)
	}
	if len(s.errs) != 1 || !strings.Contains(s.errs[0], "key_form") {
		t.Errorf("errs = %q, want the other failure alone", s.errs)
	}
	if got := s.histories.Load(); got != 3 {
		t.Errorf("histories = %d, want 3", got)
	}
}
