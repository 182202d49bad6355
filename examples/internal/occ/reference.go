package occ

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// How far a faithful reproduction may stray from the reference simulator's
// means at 200 runs or more. Time gets more room than calls
// because it varies far more from run to run.
const (
	CallsTolerance = 0.03
	TimeTolerance  = 0.05
)

// csvHeader is the reference CSV's header, which WriteCSV reproduces so the
// two files can be compared with any tool.
const csvHeader = "clients,time,calls,Algorithm,runs"

// ReadCSV reads cells in the reference's format. Standard deviations are not
// in the format and come back as zero.
func ReadCSV(r io.Reader) ([]Cell, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 || strings.Join(rows[0], ",") != csvHeader {
		return nil, fmt.Errorf("occ: CSV header is not %q", csvHeader)
	}
	var cells []Cell
	for i, row := range rows[1:] {
		var c Cell
		var errs [4]error
		c.Clients, errs[0] = strconv.Atoi(row[0])
		c.Time, errs[1] = strconv.ParseFloat(row[1], 64)
		c.Calls, errs[2] = strconv.ParseFloat(row[2], 64)
		c.Strategy = row[3]
		c.Runs, errs[3] = strconv.Atoi(row[4])
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("occ: CSV line %d: %w", i+2, err)
			}
		}
		cells = append(cells, c)
	}
	return cells, nil
}

// WriteCSV writes cells in the reference's format and order (by clients,
// then label), with the runs behind each mean.
func WriteCSV(w io.Writer, cells []Cell) error {
	sorted := slices.Clone(cells)
	slices.SortFunc(sorted, func(a, b Cell) int {
		return cmp.Or(cmp.Compare(a.Clients, b.Clients), cmp.Compare(a.Strategy, b.Strategy))
	})
	if _, err := fmt.Fprintln(w, csvHeader); err != nil {
		return err
	}
	for _, c := range sorted {
		if _, err := fmt.Fprintf(w, "%d,%.1f,%.2f,%s,%d\n", c.Clients, c.Time, c.Calls, c.Strategy, c.Runs); err != nil {
			return err
		}
	}
	return nil
}

// Find returns the cell for strategy at n clients.
func Find(cells []Cell, strategy string, n int) (Cell, bool) {
	for _, c := range cells {
		if c.Strategy == strategy && c.Clients == n {
			return c, true
		}
	}
	return Cell{}, false
}

// Deviation compares one simulated cell with its reference cell.
type Deviation struct {
	Got, Ref   Cell
	CallsRatio float64 // Got.Calls / Ref.Calls
	TimeRatio  float64 // Got.Time / Ref.Time
}

// CallsOK and TimeOK say whether the cell is within tolerance.
func (d Deviation) CallsOK() bool { return within(d.CallsRatio, CallsTolerance) }
func (d Deviation) TimeOK() bool  { return within(d.TimeRatio, TimeTolerance) }

func within(ratio, tol float64) bool { return ratio >= 1-tol && ratio <= 1+tol }

// Compare returns a Deviation for every reference cell that got has, in
// the reference's order.
func Compare(got, ref []Cell) []Deviation {
	var ds []Deviation
	for _, r := range ref {
		g, ok := Find(got, r.Strategy, r.Clients)
		if !ok {
			continue
		}
		ds = append(ds, Deviation{Got: g, Ref: r, CallsRatio: g.Calls / r.Calls, TimeRatio: g.Time / r.Time})
	}
	return ds
}
