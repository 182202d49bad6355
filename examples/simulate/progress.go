package main

import (
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows how far a scenario has got: a bar on stderr when it is a
// terminal, otherwise one line when it starts and one when it ends, so logs
// and pipes stay readable.
type progress struct {
	c    common
	name string
	bar  *progressbar.ProgressBar // nil when not on a terminal
}

// newProgress starts showing progress towards total units of work; start is
// the plain line printed when there is no terminal.
func newProgress(c common, name string, total int, start string) *progress {
	p := &progress{c: c, name: name}
	if !c.Progress {
		fmt.Fprintf(c.Stderr, "%s: %s\n", name, start)
		return p
	}
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(c.Stderr),
		progressbar.OptionSetDescription(name),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	return p
}

// describe replaces the bar's label (no-op without a terminal).
func (p *progress) describe(s string) {
	if p.bar != nil {
		p.bar.Describe(s)
	}
}

// add records finished work. Workers may call it concurrently: the bar has
// its own lock.
func (p *progress) add(work int) {
	if p.bar != nil {
		_ = p.bar.Add(work)
	}
}

// finish closes the bar; err is the scenario's, so an interrupted run does
// not claim to be done.
func (p *progress) finish(took time.Duration, err error) {
	if p.bar != nil {
		if err == nil {
			_ = p.bar.Finish()
		} else {
			_ = p.bar.Exit()
		}
	}
	if err != nil {
		fmt.Fprintf(p.c.Stderr, "%s: stopped after %.1fs\n", p.name, took.Seconds())
		return
	}
	fmt.Fprintf(p.c.Stderr, "%s: done in %.1fs\n", p.name, took.Seconds())
}
