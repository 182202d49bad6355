package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The scenario end to end at a small size: both tables, the plot file.
func TestRunPaymentsSmall(t *testing.T) {
	saved := payOpts
	t.Cleanup(func() { payOpts = saved })
	payOpts = paymentsOptions{clients: 10, intents: 3, scale: 10, strategies: "FullJitter,Exponential", flavours: "all"}

	var out, errOut bytes.Buffer
	c := common{Seed: 3, OutDir: t.TempDir(), Stdout: &out, Stderr: &errOut}
	if err := runPayments(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"payments, storm", "payments, restart", "4 idemretry+journal", "Exponential", "0 of 2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if fi, err := os.Stat(filepath.Join(c.OutDir, "payments_requests.png")); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}
