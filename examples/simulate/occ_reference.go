package main

import (
	"bytes"
	_ "embed"

	"github.com/idemretry/idemretry/examples/internal/occ"
)

// referenceCSV holds the means of the blog's own simulator, run unmodified,
// 600 runs per cell (shared/reference/brooker_occ_reference.csv). It is
// compiled in so that `go run ./simulate` works from any directory.
//
//go:embed testdata/brooker_occ_reference.csv
var referenceCSV []byte

func occReference() ([]occ.Cell, error) {
	return occ.ReadCSV(bytes.NewReader(referenceCSV))
}
