package main

import (
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
)

// occProgress shows the sweep's progress: a bar on stderr when it is a
// terminal, otherwise one line when it starts and one when it ends, so logs
// and pipes stay readable.
type occProgress struct {
	c   common
	bar *progressbar.ProgressBar // nil when not on a terminal
}

func newOccProgress(c common, totalWork int) *occProgress {
	p := &occProgress{c: c}
	if !c.Progress {
		fmt.Fprintln(c.Stderr, "occ: running the sweep...")
		return p
	}
	p.bar = progressbar.NewOptions(totalWork,
		progressbar.OptionSetWriter(c.Stderr),
		progressbar.OptionSetDescription("occ sweep"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	return p
}

// add records finished work; the sweep's workers call it concurrently,
// which the bar's own lock allows.
func (p *occProgress) add(work int) {
	if p.bar != nil {
		_ = p.bar.Add(work)
	}
}

// finish closes the bar; err is the sweep's, so an interrupted sweep does
// not claim to be done.
func (p *occProgress) finish(took time.Duration, err error) {
	if p.bar != nil {
		if err == nil {
			_ = p.bar.Finish()
		} else {
			_ = p.bar.Exit()
		}
	}
	if err != nil {
		fmt.Fprintf(p.c.Stderr, "occ: sweep stopped after %.1fs\n", took.Seconds())
		return
	}
	fmt.Fprintf(p.c.Stderr, "occ: sweep done in %.1fs\n", took.Seconds())
}
