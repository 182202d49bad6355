package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/examples/internal/payments"
)

// The scenario end to end at a small size: both tables, every check
// passing, the plot file.
func TestRunPaymentsSmall(t *testing.T) {
	out, dir, err := playPayments(t, paymentsOptions{clients: 10, intents: 3, scale: 10, strategies: "FullJitter,Exponential", flavours: "all"}, false)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	wantInOutput(t, out, "payments, storm", "payments, restart", "4 idemretry+journal", "Exponential", "0 of 2",
		"PASS  storm, flavour 4 (idemretry+journal): no payment charged twice, under every strategy",
		"FullJitter: 0 of 30 charged 2+; Exponential: 0 of 30 charged 2+",
		"PASS  storm: no lost charge",
		"PASS  restart, flavour 4 (idemretry+journal): no payment charged twice",
		"PASS  restart, flavour 4 (idemretry+journal): every killed process's payment was resent under its old key",
		"the server replayed the charged key of 2 of 2 killed payments",
		"PASS  restart, flavours 1-3",
		"PASS  restart: no lost charge")
	if strings.Contains(out, "FAIL") {
		t.Errorf("a check failed:\n%s", out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "payments_requests.png")); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}

// playPayments runs the payments scenario with opts in place of the flags
// (restored when t ends), and returns its output, the directory it wrote
// its files to and its error.
func playPayments(t *testing.T, opts paymentsOptions, csv bool) (out, dir string, err error) {
	t.Helper()
	saved := payOpts
	t.Cleanup(func() { payOpts = saved })
	payOpts = opts
	var stdout, stderr bytes.Buffer
	c := common{Seed: 3, OutDir: t.TempDir(), CSV: csv, Stdout: &stdout, Stderr: &stderr}
	err = runPayments(context.Background(), c)
	return stdout.String(), c.OutDir, err
}

// wantInOutput reports every line of want that out lacks.
func wantInOutput(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

// wantChecksFailed plays the scenario with opts and wants it to return
// errPaymentChecksFailed with every line of want in its output.
func wantChecksFailed(t *testing.T, opts paymentsOptions, want ...string) {
	t.Helper()
	out, _, err := playPayments(t, opts, false)
	if !errors.Is(err, errPaymentChecksFailed) {
		t.Errorf("runPayments = %v, want errPaymentChecksFailed", err)
	}
	wantInOutput(t, out, want...)
	t.Logf("output:\n%s", out)
}

// The checks bite: with a journal that mints a new key for every request,
// idemretry's flavour double charges every killed process's payment, and
// the scenario must say FAIL and return an error, not print PASS.
func TestRunPaymentsFailsWithForgetfulJournal(t *testing.T) {
	wantChecksFailed(t, paymentsOptions{clients: 10, intents: 3, scale: 10, strategies: "FullJitter", flavours: "4",
		wrapJournal: payments.Forgetful},
		"FAIL  restart, flavour 4 (idemretry+journal): no payment charged twice",
		"FAIL  restart, flavour 4 (idemretry+journal): every killed process's payment was resent under its old key",
		"the server replayed the charged key of 0 of 2 killed payments",
	)
}
