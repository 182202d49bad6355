// Command simulate shows, with numbers and pictures, why idemretry pairs
// durable Idempotency-Keys with full-jitter backoff. It has two scenarios:
//
//   - occ reproduces the AWS Architecture Blog's "Exponential Backoff And
//     Jitter": N clients race to update one row, retrying failed writes
//     under each backoff strategy, on a virtual clock. It prints the work
//     (calls) and the completion time of each strategy next to the blog's
//     own simulator's numbers, and checks the blog's claims.
//   - payments runs a payment server over loopback HTTP with faults and
//     restarts, counts double and lost charges per client flavour from the
//     server's ledger, and checks its claims; then it measures the retry
//     budget (an outage, the server's load against its failure rate) and
//     how a herd told the same Retry-After comes back.
//
// Each scenario prints its claims as PASS/FAIL checks with their numbers;
// a FAIL makes the command exit 1.
//
// Run it from the examples module:
//
//	go run ./simulate                 # both scenarios, about a minute
//	go run ./simulate -scenario occ -csv
//	go run ./simulate -scenario payments -csv
//
// Same -seed, same numbers. Files (plots, CSV) go to -out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"golang.org/x/term"
)

func main() {
	scenario := flag.String("scenario", "all", "scenario to run: all, occ or payments")
	seed := flag.Int64("seed", 1, "random seed; the same seed gives the same numbers")
	out := flag.String("out", "sim-out", "directory for plots and CSV files")
	occOpts := occFlags(flag.CommandLine)
	paymentsFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "simulate: unexpected argument %q\n", flag.Arg(0))
		flag.Usage()
		os.Exit(2)
	}

	c := common{
		Seed:   *seed,
		OutDir: *out,
		CSV:    occOpts.csv,
		// A bar redrawn in place is noise in a log or a pipe.
		Progress: term.IsTerminal(int(os.Stderr.Fd())),
		Stdout:   os.Stdout,
		Stderr:   os.Stderr,
	}
	// Ctrl-C stops the runs cleanly instead of killing the process midway
	// through writing a file.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var err error
	switch *scenario {
	case "all":
		occErr := runOcc(ctx, c, occOpts)
		err = errors.Join(occErr, runPaymentsAfter(ctx, c))
	case "occ":
		err = runOcc(ctx, c, occOpts)
	case "payments":
		err = runPayments(ctx, c)
	default:
		fmt.Fprintf(os.Stderr, "simulate: unknown -scenario %q (want all, occ or payments)\n", *scenario)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "simulate:", err)
		os.Exit(1)
	}
}

// runPaymentsAfter runs the payments scenario after occ, under a blank line,
// unless occ was interrupted. A failed occ check does not stop it: the two
// scenarios tell different stories.
func runPaymentsAfter(ctx context.Context, c common) error {
	if ctx.Err() != nil {
		return nil
	}
	fmt.Fprintln(c.Stdout)
	return runPayments(ctx, c)
}
