//go:build linux || darwin

package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain makes the test binary the app when the parent starts it so
// (run re-executes os.Executable(), which in a test is this binary).
func TestMain(m *testing.M) {
	if os.Getenv(envJournal) != "" {
		os.Exit(app())
	}
	goleak.VerifyTestMain(m)
}

// play runs the whole scenario: a payment server, the app as a child
// process killed with SIGKILL after the server committed the payment of
// order killAt, and the app restarted.
func play(t *testing.T, orders, killAt int, fresh bool) (*result, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	res, err := run(ctx, config{exe: exe, orders: orders, killAt: killAt, freshJournal: fresh, out: &out})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("the scenario could not be played: %v", err)
	}
	return res, out.String()
}

// The example's claim, checked on the server's ledger: the app killed with
// SIGKILL right after the server charged order 3 and before it read the
// answer resumes on restart under the same key, the server replays, and
// every order is charged exactly once, under the key the app recorded.
func TestResumeChargesEveryOrderOnce(t *testing.T) {
	for _, tc := range []struct{ orders, killAt int }{{5, 3}, {3, 3}} {
		res, out := play(t, tc.orders, tc.killAt, false)
		if len(res.problems) > 0 || exitCode(res, nil) != 0 {
			t.Errorf("kill in order %d of %d: problems %q (exit %d)", tc.killAt, tc.orders, res.problems, exitCode(res, nil))
		}
		if !strings.Contains(out, "run 1: signal: killed") {
			t.Errorf("run 1 was not reported killed by SIGKILL")
		}
		if len(res.ledger) != tc.orders {
			t.Fatalf("ledger has %d orders, want %d", len(res.ledger), tc.orders)
		}
		for _, l := range res.ledger {
			if len(l.Charges) != 1 {
				t.Errorf("%s charged %d times, want once: %+v", l.Order, len(l.Charges), l.Charges)
				continue
			}
			c := l.Charges[0]
			if e := res.book[l.Order]; e.Key != c.Key || e.Status != 200 {
				t.Errorf("%s: the app recorded %+v, the server charged %s under key %s", l.Order, e, c.ID, c.Key)
			}
			if l.Order != res.killedIn.Order {
				continue
			}
			// The killed payment: committed before the kill, then
			// resent under the same key and answered with a replay.
			if c.ID != res.killedIn.ChargeID || c.Key != res.killedIn.Key {
				t.Errorf("%s charged as %s under %s, but the kill came after %s under %s", l.Order, c.ID, c.Key, res.killedIn.ChargeID, res.killedIn.Key)
			}
			if c.Requests != 2 || c.Replays != 1 {
				t.Errorf("%s: %d requests and %d replays under its key, want 2 and 1 (resumed once, replayed)", l.Order, c.Requests, c.Replays)
			}
			if e := res.book[l.Order]; !e.Resumed || !e.Replayed {
				t.Errorf("%s: the app recorded %+v, want it answered to Resume with a replay", l.Order, e)
			}
		}
		if res.killedIn.Order != orderList(tc.orders)[tc.killAt-1].ID {
			t.Errorf("killed in %q, want order %d", res.killedIn.Order, tc.killAt)
		}
	}
}

// The negative control: the same scenario with the app restarted on an
// empty journal (keys that did not survive the crash) must double-charge
// the killed order, and the check must say so and fail the command.
func TestFreshJournalDoubleChargeIsCaught(t *testing.T) {
	res, out := play(t, 5, 3, true)
	if exitCode(res, nil) != 1 {
		t.Errorf("exit code %d with a double charge, want 1", exitCode(res, nil))
	}
	if len(res.problems) != 1 || !strings.HasPrefix(res.problems[0], "order-3 was charged 2 times") {
		t.Errorf("problems %q, want order-3 charged 2 times", res.problems)
	}
	if !strings.Contains(out, "FAIL:\n  order-3 was charged 2 times") {
		t.Errorf("the output does not report the double charge")
	}
	for _, l := range res.ledger {
		want := 1
		if l.Order == "order-3" {
			want = 2
		}
		if len(l.Charges) != want {
			t.Errorf("%s charged %d times, want %d", l.Order, len(l.Charges), want)
		}
		if len(l.Charges) == 2 && l.Charges[0].Key == l.Charges[1].Key {
			t.Errorf("%s charged twice under one key %s", l.Order, l.Charges[0].Key)
		}
	}
}

// check catches every way the ledger can be wrong, including an order never
// charged, which no run of the example produces.
func TestCheck(t *testing.T) {
	ledger := []ledgerLine{
		{Order: "order-1", Charges: []charge{{ID: "ch_1", Key: "k1"}}},
		{Order: "order-2"},
		{Order: "order-3", Charges: []charge{{ID: "ch_2", Key: "k3"}, {ID: "ch_3", Key: "k3b"}}},
		{Order: "order-4", Charges: []charge{{ID: "ch_4", Key: "k4"}}},
		{Order: "order-5", Charges: []charge{{ID: "ch_5", Key: "k5"}}},
	}
	book := map[string]bookEntry{
		"order-1": {Order: "order-1", Key: "k1"},
		"order-2": {Order: "order-2", Key: "k2"},
		"order-3": {Order: "order-3", Key: "k3b"},
		"order-4": {Order: "order-4", Key: "other"},
	}
	got := check(ledger, book)
	want := []string{
		"order-2 was never charged",
		"order-3 was charged 2 times: ch_2 under key k3, ch_3 under key k3b",
		"order-4: the app recorded key other, the server charged key k4",
		"order-5 was charged but the app has no answer for it",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("check:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := check(ledger[:1], book); len(got) != 0 {
		t.Errorf("check of a good ledger: %q", got)
	}
}

// Bad flags are refused with exit code 2 before anything runs.
func TestCLIRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-orders", "0"}, {"-kill", "6"}, {"-kill", "0"}, {"extra"}, {"-nope"}} {
		var stdout, stderr bytes.Buffer
		if code := cli(args, &stdout, &stderr); code != 2 || stdout.Len() != 0 {
			t.Errorf("cli %q: exit %d, stdout %q", args, code, stdout.String())
		}
	}
}
