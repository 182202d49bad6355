package payments

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/idemretry/idemretry"
)

// BrookerURL is Marc Brooker's "Fixing retries with token buckets and
// circuit breakers" (2022), whose simulation plots the same load curve.
const BrookerURL = "https://brooker.co.za/blog/2022/02/28/retries.html"

// WriteOutageTable prints the outage's runs, budget off then on, and what
// the budget's retries were made of.
func WriteOutageTable(w io.Writer, title string, runs []*LoadResult) error {
	tw, err := newTable(w, title, "budget\tpayments\trequests\tper payment\tretries\tparked\tgave up\tresent\tresend requests\tcharged once\tunder first key\tcharged 2+\t")
	if err != nil {
		return err
	}
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n",
			r.BudgetLabel+disturbedMark(r), r.Intents, r.Requests, r.PerIntent(), r.Retries, r.Parked, r.GaveUp,
			r.Resent, r.ResendRequests, r.ChargedOnce, r.OriginalKey, r.Duplicates)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := disturbedNote(w, runs); err != nil {
		return err
	}
	for _, r := range runs {
		if !r.Budget {
			continue
		}
		start := idemretry.DefaultBudgetTokens * r.Clients
		fmt.Fprintf(w, "With the budget: %d requests for %d first attempts (%.2fx). %d of the %d retries are the tokens the %d buckets started with; the other %d are %.3f per first attempt (the ratio is %g).\n",
			r.Requests, r.FirstAttempts, ratio(r.Requests, r.FirstAttempts), min(start, r.Retries), r.Retries, r.Clients,
			max(r.Retries-start, 0), float64(max(r.Retries-start, 0))/float64(max(r.FirstAttempts, 1)), idemretry.DefaultBudgetRatio)
	}
	return nil
}

// WriteLoadTable prints the load curve: per failure rate, requests per
// payment expected without a budget, measured without and with it, and how
// many payments the first call confirmed.
func WriteLoadTable(w io.Writer, title string, runs []*LoadResult) error {
	off, on := byRate(runs)
	tw, err := newTable(w, title, "failing\texpected, no budget\tbudget off\tbudget on\tpaid by 1st call: off\ton\tparked: on\t")
	if err != nil {
		return err
	}
	for _, p := range rates(runs) {
		a, b := off[p], on[p]
		fmt.Fprintf(tw, "%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t\n", pct(p)+disturbedMark(b), ExpectedLoad(p),
			loadCell(a, func(r *LoadResult) string { return fmt.Sprintf("%.2f", r.PerIntent()) }),
			loadCell(b, func(r *LoadResult) string { return fmt.Sprintf("%.2f", r.PerIntent()) }),
			loadCell(a, paidAtOnce), loadCell(b, paidAtOnce),
			loadCell(b, func(r *LoadResult) string { return strconv.Itoa(r.Parked) }))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// A budget-less run's count is the seed's, whatever the timing: only
	// the budget's refills depend on it.
	var budgeted []*LoadResult
	for _, r := range runs {
		if r.Budget {
			budgeted = append(budgeted, r)
		}
	}
	return disturbedNote(w, budgeted)
}

// disturbedMark is " !" for a run the machine stalled past LoadStallLimit
// in every play.
func disturbedMark(r *LoadResult) string {
	if r != nil && r.Disturbed() {
		return " !"
	}
	return ""
}

func disturbedNote(w io.Writer, runs []*LoadResult) error {
	for _, r := range runs {
		if r.Disturbed() {
			_, err := fmt.Fprintf(w, "! the machine froze this run for more than %v of virtual time in every play: its timing, and the budget's share of retries that depends on it, are not to be trusted.\n", LoadStallLimit)
			return err
		}
	}
	return nil
}

func paidAtOnce(r *LoadResult) string {
	return fmt.Sprintf("%.1f%%", 100*float64(r.PaidAtOnce)/float64(max(r.Intents, 1)))
}

func loadCell(r *LoadResult, f func(*LoadResult) string) string {
	if r == nil {
		return "-"
	}
	return f(r)
}

// byRate indexes runs by failure rate, budget off and on.
func byRate(runs []*LoadResult) (off, on map[float64]*LoadResult) {
	off, on = map[float64]*LoadResult{}, map[float64]*LoadResult{}
	for _, r := range runs {
		if r.Budget {
			on[r.FailRate] = r
		} else {
			off[r.FailRate] = r
		}
	}
	return off, on
}

// rates lists the runs' failure rates, in the order first played.
func rates(runs []*LoadResult) []float64 {
	var out []float64
	seen := map[float64]bool{}
	for _, r := range runs {
		if !seen[r.FailRate] {
			seen[r.FailRate] = true
			out = append(out, r.FailRate)
		}
	}
	return out
}

// WriteHerdTable prints the width of the window in which each rule's herd
// came back, per round and median.
func WriteHerdTable(w io.Writer, title string, herds []*HerdResult) error {
	tw, err := newTable(w, title, "rule\twindow, median\tper round\tfirst back after\tlast back after\t")
	if err != nil {
		return err
	}
	for _, h := range herds {
		var rounds []string
		for _, d := range h.Widths {
			rounds = append(rounds, ms(d))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", h.Rule, ms(h.MedianWidth()), strings.Join(rounds, " "),
			secs(minDuration(h.Earliest)), secs(maxDuration(h.Latest)))
	}
	return tw.Flush()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func secs(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

func maxDuration(xs []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// WriteLoadCSV writes one row per overload run.
func WriteLoadCSV(w io.Writer, runs []*LoadResult) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"fail_rate", "budget", "transports", "payments", "first_attempts", "requests", "requests_per_payment",
		"expected_without_budget", "retries", "paid_first_call", "parked", "gave_up", "resent", "resend_requests",
		"paid", "charged_once", "charged_once_first_key", "charged_twice", "fail_end_s"})
	for _, r := range runs {
		cw.Write([]string{
			strconv.FormatFloat(r.FailRate, 'f', -1, 64), strconv.FormatBool(r.Budget),
			strconv.Itoa(r.Clients), strconv.Itoa(r.Intents), strconv.Itoa(r.FirstAttempts), strconv.Itoa(r.Requests),
			strconv.FormatFloat(r.PerIntent(), 'f', 4, 64), strconv.FormatFloat(ExpectedLoad(r.FailRate), 'f', 4, 64),
			strconv.Itoa(r.Retries), strconv.Itoa(r.PaidAtOnce), strconv.Itoa(r.Parked), strconv.Itoa(r.GaveUp),
			strconv.Itoa(r.Resent), strconv.Itoa(r.ResendRequests), strconv.Itoa(r.Paid), strconv.Itoa(r.ChargedOnce),
			strconv.Itoa(r.OriginalKey), strconv.Itoa(r.Duplicates), strconv.FormatFloat(r.FailEnd.Seconds(), 'f', 3, 64),
		})
	}
	cw.Flush()
	return cw.Error()
}

// WriteHerdCSV writes one row per herd round.
func WriteHerdCSV(w io.Writer, herds []*HerdResult) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"rule", "round", "clients", "retry_after_s", "window_ms", "first_back_s", "last_back_s"})
	for _, h := range herds {
		rule := "floor"
		if h.Rule == MaxRule {
			rule = "max"
		}
		for i := range h.Widths {
			cw.Write([]string{rule, strconv.Itoa(i + 1), strconv.Itoa(h.Clients),
				strconv.FormatFloat(h.RetryAfter.Seconds(), 'f', -1, 64),
				strconv.FormatFloat(float64(h.Widths[i])/float64(time.Millisecond), 'f', 3, 64),
				strconv.FormatFloat(h.Earliest[i].Seconds(), 'f', 4, 64),
				strconv.FormatFloat(h.Latest[i].Seconds(), 'f', 4, 64)})
		}
	}
	cw.Flush()
	return cw.Error()
}
