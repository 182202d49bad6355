package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/idemretry/idemretry/examples/internal/payments"
)

// errPaymentChecksFailed reports that the payments scenario ran but one of
// its claims did not hold; the details are already printed.
var errPaymentChecksFailed = errors.New("payments: a check failed (see FAIL above)")

// paymentsOptions are the payments scenario's flags.
type paymentsOptions struct {
	clients, intents int
	scale            float64
	strategies       string
	flavours         string
	journals         string
	matrix           bool

	// wrapJournal is no flag: tests set it to break flavours 3 and 4's
	// journals on purpose (see payments.Config.WrapJournal), and the
	// overload phase's.
	wrapJournal func(journal.Journal) journal.Journal

	overload overloadOptions
}

var payOpts paymentsOptions

func paymentsFlags(fs *flag.FlagSet) {
	def := payments.StormConfig(0)
	fs.IntVar(&payOpts.clients, "pay-clients", def.Clients, "payments: client processes per run (size it up with this)")
	fs.IntVar(&payOpts.intents, "pay-intents", def.Intents, "payments: payments each client makes, one after another")
	fs.Float64Var(&payOpts.scale, "pay-scale", def.Scale, "payments: virtual time runs this many times faster than the wall clock; lower is slower and less noisy")
	fs.StringVar(&payOpts.strategies, "pay-strategies", "all", "payments: backoff strategies, comma-separated (FullJitter,EqualJitter,Decorr,Exponential,None) or all")
	fs.StringVar(&payOpts.flavours, "pay-flavours", "all", "payments: client flavours 1-4, comma-separated, or all")
	fs.BoolVar(&payOpts.matrix, "pay-matrix", false, "payments: storm every flavour under every strategy (default: flavours 1-3 under the first strategy only, flavour 4 under all)")
	fs.StringVar(&payOpts.journals, "pay-journals", "", "payments: keep flavour 4's file journals in a new directory under this one (default: a temporary directory, removed afterwards)")
	overloadFlags(fs)
}

// runPayments plays the storm phase (flavour 4 under every strategy, the
// others under the first), the restart phase (every flavour, first
// strategy) and the overload phase (flavour 4, retry budget off and on: an
// outage, the load curve against the failure rate, the Retry-After herd),
// prints their tables and draws flavour 4's request rate per strategy, the
// outage and the load curve.
func runPayments(ctx context.Context, c common) error {
	strategies, err := payments.ParseStrategies(payOpts.strategies)
	if err != nil {
		return err
	}
	flavours, err := payments.ParseFlavours(payOpts.flavours)
	if err != nil {
		return err
	}
	// The real file journal on the real disk: each client process gets its
	// own directory, fresh for this invocation (an old journal would hold
	// keys for another server's URL), and keeps it across its restarts.
	journals, err := os.MkdirTemp(payOpts.journals, "idemretry-payments-")
	if err != nil {
		return err
	}
	if payOpts.journals == "" {
		defer os.RemoveAll(journals)
	}
	p := planPayments(c.Seed, journals, flavours, strategies)
	if err := p.play(ctx, c, journals); err != nil {
		return err
	}
	return p.report(c)
}

// paymentsPlan is the payments scenario's runs, and their results once
// played.
type paymentsPlan struct {
	storm, restart       []payments.Config
	stormRes, restartRes []*payments.Result
	ov                   *overload
}

// planPayments sizes the storm and restart phases' runs from the flags,
// each with a file journal of its own under journals.
func planPayments(seed int64, journals string, flavours []payments.Flavour, strategies []payments.Strategy) *paymentsPlan {
	p := &paymentsPlan{}
	for _, f := range flavours {
		// The key handling, not the backoff, is what sets flavours 1-3 apart:
		// one strategy each is enough unless asked for the full matrix.
		ss := strategies
		if f != payments.FileJournal && !payOpts.matrix {
			ss = strategies[:1]
		}
		for _, s := range ss {
			cfg := sizedConfig(payments.StormConfig(seed))
			cfg.Flavour, cfg.Strategy = f, s
			cfg.JournalDir = filepath.Join(journals, fmt.Sprintf("storm-%d-%s", f, s.Name))
			p.storm = append(p.storm, cfg)
		}
		cfg := sizedConfig(payments.RestartConfig(seed))
		cfg.Flavour, cfg.Strategy = f, strategies[0]
		cfg.JournalDir = filepath.Join(journals, fmt.Sprintf("restart-%d", f))
		p.restart = append(p.restart, cfg)
	}
	return p
}

// sizedConfig returns cfg sized by the flags.
func sizedConfig(cfg payments.Config) payments.Config {
	cfg.Clients, cfg.Intents, cfg.Scale = payOpts.clients, payOpts.intents, payOpts.scale
	cfg.WrapJournal = payOpts.wrapJournal
	if cfg.Crashers > 0 { // the restart phase kills a fifth of the clients
		cfg.Crashers = max(1, cfg.Clients/5)
	}
	return cfg
}

// play plays the storm, restart and overload phases in turn, under one
// progress bar, and stops at the first error.
func (p *paymentsPlan) play(ctx context.Context, c common, journals string) error {
	start := time.Now()
	runs := len(p.storm) + len(p.restart) + overloadRuns(payOpts.overload)
	prog := newProgress(c, "payments", runs, fmt.Sprintf("playing %d runs...", runs))
	var err error
	p.stormRes, err = playPaymentRuns(ctx, c, prog, p.storm)
	if err == nil {
		p.restartRes, err = playPaymentRuns(ctx, c, prog, p.restart)
	}
	p.ov = &overload{}
	if err == nil {
		p.ov, err = runOverload(ctx, c, journals, prog)
	}
	prog.finish(time.Since(start), err)
	return err
}

// playPaymentRuns plays each of cfgs and returns their results, noting on
// c.Stderr a run the machine disturbed.
func playPaymentRuns(ctx context.Context, c common, prog *progress, cfgs []payments.Config) ([]*payments.Result, error) {
	var out []*payments.Result
	for _, cfg := range cfgs {
		prog.describe(fmt.Sprintf("payments %s / %s", cfg.Flavour, cfg.Strategy.Name))
		res, err := payments.Play(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("payments %s / %s: %w", cfg.Flavour, cfg.Strategy.Name, err)
		}
		prog.add(1)
		if res.Plays > 1 || res.Disturbed() {
			fmt.Fprintf(c.Stderr, "payments %s / %s: the machine froze a play for more than %v of virtual time; played %d times (last play's longest freeze: %v)\n",
				cfg.Flavour, cfg.Strategy.Name, res.StallLimit, res.Plays, res.Stall.Round(time.Millisecond))
		}
		out = append(out, res)
	}
	return out, nil
}

// report prints the played phases' tables and checks, and writes the plot
// and the overload files. It returns errPaymentChecksFailed if a check
// failed.
func (p *paymentsPlan) report(c common) error {
	if err := p.writeTables(c.Stdout); err != nil {
		return err
	}
	def := p.storm[0]
	fmt.Fprintf(c.Stdout, "All times are virtual (the clock runs %gx faster than the wall clock%s).\n\n", def.Scale, overloadScales(p.ov, def.Scale))
	checks := append(payments.StormChecks(p.stormRes), payments.RestartChecks(p.restartRes)...)
	checks = append(checks, payments.OverloadChecks(p.ov.curve, p.ov.herds)...)
	printPaymentChecks(c.Stdout, checks)
	if err := writePaymentsPlot(c, def, p.stormRes); err != nil {
		return err
	}
	written, err := writeOverloadFiles(c, p.ov)
	if err != nil {
		return fmt.Errorf("payments: %w", err)
	}
	if len(written) > 0 {
		fmt.Fprintf(c.Stdout, "Overload: %s\n", describeWritten(written))
	}
	if payments.Failed(checks) {
		return errPaymentChecksFailed
	}
	return nil
}

// writeTables prints the storm, restart and overload phases' tables.
func (p *paymentsPlan) writeTables(w io.Writer) error {
	def := p.storm[0]
	title := fmt.Sprintf("payments, storm: %d clients x %d payments; answers lost after commit (%.0f%%), charges slower than the client's %v timeout (%.0f%%), outage %v-%v (fast 503s) then %v warm-up, capacity %d (429 + Retry-After: 1)",
		def.Clients, def.Intents, 100*def.DropRate, def.AttemptTimeout, 100*def.SlowRate,
		def.Outage.Start, def.Outage.End, def.Outage.WarmUp, def.Capacity)
	if err := payments.WriteTable(w, title, p.stormRes); err != nil {
		return err
	}
	rdef := p.restart[0]
	fmt.Fprintln(w)
	title = fmt.Sprintf("payments, restart: no faults; %d clients killed once right after the server committed one of their payments, restarted %v later, re-issue what is unconfirmed (%s)",
		rdef.Crashers, rdef.RestartDelay, rdef.Strategy.Name)
	if err := payments.WriteTable(w, title, p.restartRes); err != nil {
		return err
	}
	return printOverload(w, p.ov)
}

// printPaymentChecks prints each claim of the scenario with its outcome and
// the numbers behind it, as the occ scenario does.
func printPaymentChecks(w io.Writer, checks []payments.Check) {
	fmt.Fprintln(w, "The payments scenario's claims, checked on these runs:")
	for _, c := range checks {
		fmt.Fprintf(w, "  %s  %s\n        %s\n", c.Status, c.Claim, c.Detail)
	}
}

// writePaymentsPlot draws flavour 4's request rate per strategy, if the
// storm played flavour 4.
func writePaymentsPlot(c common, def payments.Config, stormRes []*payments.Result) error {
	var plotted []*payments.Result
	for _, r := range stormRes {
		if r.Flavour == payments.FileJournal {
			plotted = append(plotted, r)
		}
	}
	if len(plotted) == 0 {
		return nil
	}
	if err := os.MkdirAll(c.OutDir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(c.OutDir, "payments_requests.png")
	if err := payments.WritePlot(path, fmt.Sprintf(
		"idemretry + file journal, requests per 10 ms reaching the server, by backoff strategy (red: outage, fast 503s; orange: warm-up, more than %d in flight shed with 503)",
		def.WarmCapacity), plotted); err != nil {
		return err
	}
	fmt.Fprintf(c.Stdout, "Plot: %s\n", path)
	return nil
}
