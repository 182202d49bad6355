package payments

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteTable prints one row per run.
func WriteTable(w io.Writer, title string, results []*Result) error {
	tw, err := newTable(w, title, "flavour\tstrategy\tintents\tcharged 2+\textra\tat restarts\trequests\tper intent\tpeak/10ms after\t503 after\tp50\tp99\tgave up\t")
	if err != nil {
		return err
	}
	disturbed := false
	for _, r := range results {
		strategy := r.Strategy
		if r.Disturbed() {
			strategy, disturbed = strategy+" !", true
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%.2f\t%s\t%s\t%s\t%s\t%d\t\n",
			r.Flavour, strategy, r.Intents, r.Duplicates, r.Extra, restarts(r),
			r.Requests, r.Amplification, afterOutage(r, r.PeakAfterOutage),
			afterOutage(r, r.Rejected503AfterRecovery), seconds(r.P50), seconds(r.P99), r.GaveUp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if disturbed {
		_, err := fmt.Fprintln(w, "! the machine froze this run for longer than half an attempt timeout in every play: its timing numbers are not to be trusted.")
		return err
	}
	return nil
}

func restarts(r *Result) string {
	if r.Crashes == 0 {
		return "-"
	}
	return fmt.Sprintf("%d of %d", r.RestartDuplicates, r.Crashes)
}

func afterOutage(r *Result, n int) string {
	if r.Outage.End <= r.Outage.Start {
		return "-"
	}
	return fmt.Sprint(n)
}

func seconds(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// newTable writes title on its own line and returns a right-aligned table
// writer on w that starts with the tab-separated header.
func newTable(w io.Writer, title, header string) (*tabwriter.Writer, error) {
	if _, err := fmt.Fprintln(w, title); err != nil {
		return nil, err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, header)
	return tw, nil
}
