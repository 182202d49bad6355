package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/idemretry/idemretry"

	"github.com/idemretry/idemretry/examples/internal/payments"
)

// overloadOptions are the flags of the payments scenario's overload phase.
type overloadOptions struct {
	clients, intents        int
	herdClients, herdRounds int
	herdScale, outageScale  float64
	loadOptions             []idemretry.Option // no flag: tests break the runs' configuration with it
}

func overloadFlags(fs *flag.FlagSet) {
	def, herd := payments.OutageConfig(0), payments.DefaultHerd(payments.FloorRule)
	fs.IntVar(&payOpts.overload.clients, "pay-load-clients", def.Clients, "payments, overload: app instances (one Transport and file journal each); 0 skips the outage and the load curve")
	fs.IntVar(&payOpts.overload.intents, "pay-load-intents", def.Intents, "payments, overload: payments each instance makes, one every 20 ms of virtual time")
	fs.Float64Var(&payOpts.overload.outageScale, "pay-load-scale", def.Scale, "payments, overload: the outage runs' clock speed-up (the load curve's other points run twice as fast)")
	fs.IntVar(&payOpts.overload.herdClients, "pay-herd-clients", herd.Clients, "payments, Retry-After herd: clients told \"Retry-After: 1\" at once; 0 skips the herd")
	fs.IntVar(&payOpts.overload.herdRounds, "pay-herd-rounds", herd.Rounds, "payments, Retry-After herd: herds per rule")
	fs.Float64Var(&payOpts.overload.herdScale, "pay-herd-scale", herd.Scale, "payments, Retry-After herd: the clock's speed-up")
}

// overload is what the overload phase played: the load curve (whose 100 %
// runs are the outage) and the Retry-After herds.
type overload struct {
	outage, curve []*payments.LoadResult
	herds         []*payments.HerdResult
	outageCfg     payments.LoadConfig
	herdCfg       payments.HerdConfig
}

// overloadRuns counts the runs the phase will play, for the progress bar.
func overloadRuns(o overloadOptions) int {
	n := 0
	if o.clients > 0 && o.intents > 0 {
		n += 2 * len(payments.FailRates)
	}
	if o.herdClients > 0 {
		n += 2
	}
	return n
}

// runOverload plays the outage (budget off and on at once: their counts do
// not depend on each other's timing), the load curve's other points (budget
// off all at once, their counts being fixed by the seed; budget on one
// after another, since a bucket's refills depend on timing), then the two
// Retry-After herds, one after the other.
func runOverload(ctx context.Context, c common, journals string, prog *progress) (*overload, error) {
	o := payOpts.overload
	ov := &overload{}
	if o.clients > 0 && o.intents > 0 {
		size := func(cfg payments.LoadConfig, budget bool) payments.LoadConfig {
			cfg = cfg.Sized(o.clients, o.intents)
			cfg.Budget, cfg.Scale = budget, o.outageScale
			if cfg.FailRate < 1 {
				cfg.Scale = 2 * o.outageScale
			}
			cfg.Options, cfg.WrapJournal = o.loadOptions, payOpts.wrapJournal
			cfg.JournalDir = filepath.Join(journals, fmt.Sprintf("overload-%.0f-%t", 100*cfg.FailRate, budget))
			return cfg
		}
		ov.outageCfg = size(payments.OutageConfig(c.Seed), true)
		var off, on []payments.LoadConfig
		for _, p := range payments.FailRates {
			if p < 1 {
				off = append(off, size(payments.LoadSweepConfig(c.Seed, p), false))
				on = append(on, size(payments.LoadSweepConfig(c.Seed, p), true))
			}
		}
		// The outage's picture over time and the budget's refills depend
		// on timing: those runs play one after another, each again if the
		// machine stalled it. The budget-less points of the curve count
		// what the seed decides, whatever the timing: they play at once.
		outage := []payments.LoadConfig{size(payments.OutageConfig(c.Seed), false), ov.outageCfg}
		prog.describe("payments overload: outage, budget off, then on")
		res, err := playLoads(ctx, c, outage, false, prog)
		if err != nil {
			return nil, err
		}
		ov.outage = res
		prog.describe("payments overload: load curve, budget off")
		offRes, err := playLoads(ctx, c, off, true, prog)
		if err != nil {
			return nil, err
		}
		prog.describe("payments overload: load curve, budget on")
		onRes, err := playLoads(ctx, c, on, false, prog)
		if err != nil {
			return nil, err
		}
		for i := range offRes {
			ov.curve = append(ov.curve, offRes[i], onRes[i])
		}
		ov.curve = append(ov.curve, ov.outage...)
	}
	if o.herdClients > 0 {
		for _, rule := range []payments.RetryAfterRule{payments.MaxRule, payments.FloorRule} {
			cfg := payments.DefaultHerd(rule)
			cfg.Clients, cfg.Rounds, cfg.Scale = o.herdClients, o.herdRounds, o.herdScale
			ov.herdCfg = cfg
			prog.describe("payments overload: Retry-After herd, " + rule.String())
			h, err := payments.RunHerd(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("payments herd (%s): %w", rule, err)
			}
			prog.add(1)
			ov.herds = append(ov.herds, h)
		}
	}
	return ov, nil
}

// playLoads plays cfgs in order: all at once, once each, or one after
// another, each again while the machine stalls it (see payments.PlayLoad).
func playLoads(ctx context.Context, c common, cfgs []payments.LoadConfig, together bool, prog *progress) ([]*payments.LoadResult, error) {
	out := make([]*payments.LoadResult, len(cfgs))
	errs := make([]error, len(cfgs))
	play := func(i int) {
		cfg := cfgs[i]
		name := fmt.Sprintf("payments overload %s failing, budget %s", fmtRate(cfg.FailRate), cfg.BudgetLabel())
		var res *payments.LoadResult
		var err error
		if together {
			res, err = payments.RunLoad(ctx, cfg)
		} else {
			res, err = payments.PlayLoad(ctx, cfg)
		}
		if err != nil {
			errs[i] = fmt.Errorf("%s: %w", name, err)
			return
		}
		if res.Plays > 1 || (!together && res.Disturbed()) {
			fmt.Fprintf(c.Stderr, "%s: the machine froze a play for more than %v of virtual time; played %d times (last play's longest freeze: %v)\n",
				name, payments.LoadStallLimit, res.Plays, res.Stall.Round(time.Millisecond))
		}
		out[i] = res
		prog.add(1)
	}
	if together {
		var wg sync.WaitGroup
		for i := range cfgs {
			wg.Add(1)
			go func() { defer wg.Done(); play(i) }()
		}
		wg.Wait()
	} else {
		for i := range cfgs {
			play(i)
		}
	}
	return out, errors.Join(errs...)
}

func fmtRate(p float64) string { return fmt.Sprintf("%.0f%%", 100*p) }

// printOverload prints the outage, the load curve and the herds.
func printOverload(w io.Writer, ov *overload) error {
	if len(ov.outage) > 0 {
		cfg := ov.outageCfg
		fmt.Fprintln(w)
		title := fmt.Sprintf("payments, outage: %d app instances (one Transport and file journal each) x %d payments, one every %v each, all begun in the first %v; every attempt fails fast with 503 until %v; then each instance resends what it could not confirm, under the same action id",
			cfg.Clients, cfg.Intents, cfg.Interval, cfg.Arrivals(), cfg.FailFor)
		if err := payments.WriteOutageTable(w, title, ov.outage); err != nil {
			return err
		}
	}
	if len(ov.curve) > 0 {
		fmt.Fprintln(w)
		title := "payments, load against failure rate: the same fleet; each attempt fails fast with 503 at random (seeded, per payment and attempt), for as long as the payments take; requests per payment until they return"
		if err := payments.WriteLoadTable(w, title, ov.curve); err != nil {
			return err
		}
		fmt.Fprintf(w, "Beside Brooker (2022), %s: his simulation (100 clients, calls failing at random) plots the same curve. N retries does 1+N times the work at 100%% failing (N = 3 in his figure, 5 here); his bucket, filled 0.1 per success (here: per first attempt), behaves like N retries well below 10%% failing and like \"0.1 retries\" well above.\n", payments.BrookerURL)
	}
	if len(ov.herds) > 0 {
		cfg := ov.herdCfg
		fmt.Fprintln(w)
		title := fmt.Sprintf("payments, Retry-After herd: %d clients, each its own Transport, told \"Retry-After: %d\" by the server at the same moment; the window in which their retries reach the server, %d rounds per rule (clock %gx)",
			cfg.Clients, cfg.RetryAfter, cfg.Rounds, cfg.Scale)
		if err := payments.WriteHerdTable(w, title, ov.herds); err != nil {
			return err
		}
	}
	return nil
}

// writeOverloadFiles draws the outage and the load curve and, with -csv,
// writes the runs and the herds as CSV; it returns the paths written.
func writeOverloadFiles(c common, ov *overload) ([]string, error) {
	var written []string
	if len(ov.curve) == 0 && len(ov.herds) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(c.OutDir, 0o755); err != nil {
		return nil, err
	}
	if len(ov.outage) > 0 {
		path := filepath.Join(c.OutDir, "payments_outage.png")
		cfg := ov.outageCfg
		if err := payments.WriteOutagePlot(path, fmt.Sprintf(
			"requests per %v reaching the server, %d instances x %d payments, an outage of fast 503s (red), retry budget off and on; then the resends",
			payments.LoadBucket, cfg.Clients, cfg.Intents), ov.outage); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	if len(ov.curve) > 0 {
		path := filepath.Join(c.OutDir, "payments_load.png")
		if err := payments.WriteLoadPlot(path,
			"each attempt fails fast with 503 with probability p; idemretry's defaults (5 retries, full jitter), retry budget off and on (10 tokens, 0.1 per first attempt)",
			ov.curve); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	if c.CSV && len(ov.curve) > 0 {
		path := filepath.Join(c.OutDir, "payments_overload.csv")
		if err := writeCSV(path, func(w io.Writer) error { return payments.WriteLoadCSV(w, ov.curve) }); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	if c.CSV && len(ov.herds) > 0 {
		path := filepath.Join(c.OutDir, "payments_retry_after.csv")
		if err := writeCSV(path, func(w io.Writer) error { return payments.WriteHerdCSV(w, ov.herds) }); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	return written, nil
}

func writeCSV(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// describeWritten lists written files for the output.
func describeWritten(paths []string) string { return strings.Join(paths, ", ") }

// overloadScales names the overload runs' clocks that differ from the
// storm's, for the line under the tables.
func overloadScales(ov *overload, storm float64) string {
	var parts []string
	for _, r := range ov.curve {
		if r.Scale != storm {
			parts = append(parts, fmt.Sprintf("the load curve below 100%% failing %gx", r.Scale))
			break
		}
	}
	if len(ov.outage) > 0 && ov.outage[0].Scale != storm {
		parts = append(parts, fmt.Sprintf("the outage %gx", ov.outage[0].Scale))
	}
	if len(ov.herds) > 0 && ov.herdCfg.Scale != storm {
		parts = append(parts, fmt.Sprintf("the herds %gx", ov.herdCfg.Scale))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, ", ")
}
