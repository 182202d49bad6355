package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/journal"
)

// The scenario end to end at a small size: both tables, every check
// passing, the plot file.
func TestRunPaymentsSmall(t *testing.T) {
	saved := payOpts
	t.Cleanup(func() { payOpts = saved })
	payOpts = paymentsOptions{clients: 10, intents: 3, scale: 10, strategies: "FullJitter,Exponential", flavours: "all"}

	var out, errOut bytes.Buffer
	c := common{Seed: 3, OutDir: t.TempDir(), Stdout: &out, Stderr: &errOut}
	if err := runPayments(context.Background(), c); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"payments, storm", "payments, restart", "4 idemretry+journal", "Exponential", "0 of 2",
		"PASS  storm, flavour 4 (idemretry+journal): no payment charged twice, under every strategy",
		"FullJitter: 0 of 30 charged 2+; Exponential: 0 of 30 charged 2+",
		"PASS  storm: no lost charge",
		"PASS  restart, flavour 4 (idemretry+journal): no payment charged twice",
		"PASS  restart, flavour 4 (idemretry+journal): every killed process's payment was resent under its old key",
		"the server replayed the charged key of 2 of 2 killed payments",
		"PASS  restart, flavours 1-3",
		"PASS  restart: no lost charge"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "FAIL") {
		t.Errorf("a check failed:\n%s", out.String())
	}
	if fi, err := os.Stat(filepath.Join(c.OutDir, "payments_requests.png")); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}

// forgetfulJournal is a broken journal: it forgets an action's record
// before every Reserve, so each RoundTrip mints a new key, while
// Unfinished still lists what a crashed process left pending.
type forgetfulJournal struct{ journal.Journal }

func (j forgetfulJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if err := j.Journal.Forget(ctx, rec.ActionID); err != nil {
		return journal.Record{}, false, err
	}
	return j.Journal.Reserve(ctx, rec, mode)
}

// The checks bite: with a journal that mints a new key for every request,
// idemretry's flavour double charges every killed process's payment, and
// the scenario must say FAIL and return an error, not print PASS.
func TestRunPaymentsFailsWithForgetfulJournal(t *testing.T) {
	saved := payOpts
	t.Cleanup(func() { payOpts = saved })
	payOpts = paymentsOptions{clients: 10, intents: 3, scale: 10, strategies: "FullJitter", flavours: "4",
		wrapJournal: func(j journal.Journal) journal.Journal { return forgetfulJournal{j} }}

	var out, errOut bytes.Buffer
	c := common{Seed: 3, OutDir: t.TempDir(), Stdout: &out, Stderr: &errOut}
	err := runPayments(context.Background(), c)
	if !errors.Is(err, errPaymentChecksFailed) {
		t.Errorf("runPayments = %v, want errPaymentChecksFailed", err)
	}
	for _, want := range []string{
		"FAIL  restart, flavour 4 (idemretry+journal): no payment charged twice",
		"FAIL  restart, flavour 4 (idemretry+journal): every killed process's payment was resent under its old key",
		"the server replayed the charged key of 0 of 2 killed payments",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	t.Logf("output:\n%s", out.String())
}
