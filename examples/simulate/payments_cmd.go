package main

// TEMPORARY stub, replaced by the payments scenario.

import (
	"context"
	"errors"
	"flag"
)

func paymentsFlags(fs *flag.FlagSet) {}

func runPayments(ctx context.Context, c common) error {
	return errors.New("payments scenario not implemented yet")
}
