package main

import (
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
)

// paymentsProgress shows which run is playing: a bar on stderr when it is a
// terminal, otherwise one line at the start and one at the end.
type paymentsProgress struct {
	c   common
	bar *progressbar.ProgressBar // nil when not on a terminal
}

func newPaymentsProgress(c common, runs int) *paymentsProgress {
	p := &paymentsProgress{c: c}
	if !c.Progress {
		fmt.Fprintf(c.Stderr, "payments: playing %d runs...\n", runs)
		return p
	}
	p.bar = progressbar.NewOptions(runs,
		progressbar.OptionSetWriter(c.Stderr),
		progressbar.OptionSetDescription("payments"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	return p
}

func (p *paymentsProgress) describe(s string) {
	if p.bar != nil {
		p.bar.Describe(s)
	}
}

func (p *paymentsProgress) add() {
	if p.bar != nil {
		_ = p.bar.Add(1)
	}
}

func (p *paymentsProgress) finish(took time.Duration) {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
	fmt.Fprintf(p.c.Stderr, "payments: done in %.1fs\n", took.Seconds())
}
