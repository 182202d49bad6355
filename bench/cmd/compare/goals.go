package main

import (
	"fmt"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/idemretry/idemretry/bench"
)

// printGoals prints the performance goals (bench/README.md), each with its measured median and
// its target: "ok" when met, "over" when not, "-" for a figure reported
// without a target. Goals whose case did not run are left out.
func (res *results) printGoals(rounds int) {
	fmt.Printf("\nperformance goals (medians of %d rounds; ratios against net/http in the same round)\n", rounds)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "goal\tmeasured\ttarget\t\t")
	row := func(goal, measured, target string, ok bool, judged bool) {
		v := "-"
		if judged {
			v = "over"
			if ok {
				v = "ok"
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", goal, measured, target, v)
	}
	pm := func(c, client string, f func(ratios) float64) (float64, bool) {
		rs := res.pairs[c+"/"+client]
		return medianOf(rs, f), len(rs) > 0
	}
	cpuQ := func(r ratios) float64 { return r.cpu }
	if cpu, ok := pm("post", bench.IdemMemory, cpuQ); ok {
		target := "<= 1.10x"
		if rh, ok := pm("post", bench.RetryableHTTP, cpuQ); ok {
			fs, _ := pm("post", bench.Failsafe, cpuQ)
			target += fmt.Sprintf(" (retryablehttp %.2fx, failsafe %.2fx)", rh, fs)
		}
		row("1 hot path, memory journal, 1 KiB POST: CPU", fmt.Sprintf("%.2fx", cpu), target, cpu <= 1.10, true)
		for _, q := range []struct {
			what string
			f    func(ratios) float64
		}{{"B/op", func(r ratios) float64 { return r.bPerOp }}, {"allocs/op", func(r ratios) float64 { return r.allocsOp }}} {
			own, _ := pm("post", bench.IdemMemory, q.f)
			rh, okR := pm("post", bench.RetryableHTTP, q.f)
			fs, okF := pm("post", bench.Failsafe, q.f)
			if okR && okF {
				row("1 hot path, memory journal, 1 KiB POST: "+q.what, fmt.Sprintf("%.0f", own),
					fmt.Sprintf("< %.0f (retryablehttp), < %.0f (failsafe)", rh, fs), own < rh && own < fs, true)
			}
		}
		// Not the goal's measure, which is the peers as they come: the
		// peers with the key every payment request carries, minted and set
		// by hand, and paid for on the wire.
		cpuK, okC := pm("post", bench.RetryableHTTPKey, cpuQ)
		cpuFK, _ := pm("post", bench.FailsafeKey, cpuQ)
		allocsQ := func(r ratios) float64 { return r.allocsOp }
		rk, okR := pm("post", bench.RetryableHTTPKey, allocsQ)
		fk, okF := pm("post", bench.FailsafeKey, allocsQ)
		if okC && okR && okF {
			own, _ := pm("post", bench.IdemMemory, allocsQ)
			row("1 ... against the peers with a key set by hand: CPU; allocs/op", fmt.Sprintf("%.2fx; %.0f", cpu, own),
				fmt.Sprintf("(%s %.2fx; %.0f, %s %.2fx; %.0f)", bench.RetryableHTTPKey, cpuK, rk, bench.FailsafeKey, cpuFK, fk), false, false)
		}
	}
	if len(res.goal2) > 0 {
		file := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.file) })
		bound := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.bound()) })
		probe := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.probe) })
		net := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.net) })
		over := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.file - g.bound()) })
		row("2 file journal, concurrency 1, named: µs per action (p50)", fmt.Sprintf("%.0f (%+.0f vs bound)", file, over),
			fmt.Sprintf("<= %.0f = probe %.0f + nethttp %.0f + %.0f", bound, probe, net, us(goal2Slack)), over <= 0, true)
		if floor := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.floor) }); floor > 0 {
			row("2 ... named over "+bench.ProbeThenNetHTTP+" (a sync, then a request, in turn; p50)",
				fmt.Sprintf("%+.0f", medianOf(res.goal2, func(g goal2Round) float64 { return us(g.file - g.floor) })),
				fmt.Sprintf("(%s %.0f: %+.0f over probe + nethttp apart)", bench.ProbeThenNetHTTP, floor,
					medianOf(res.goal2, func(g goal2Round) float64 { return us(g.floor - g.probe - g.net) })), false, false)
		}
		if h := medianOf(res.goal2, func(g goal2Round) float64 { return us(g.handoff) }); h > 0 {
			row("2 ... named over "+bench.ProbeHandoffThenNetHTTP+" (the sync on a goroutine of its own; p50)",
				fmt.Sprintf("%+.0f", medianOf(res.goal2, func(g goal2Round) float64 { return us(g.file - g.handoff) })),
				fmt.Sprintf("(%s %.0f: %+.0f over %s)", bench.ProbeHandoffThenNetHTTP, h,
					medianOf(res.goal2, func(g goal2Round) float64 { return us(g.handoff - g.floor) }), bench.ProbeThenNetHTTP), false, false)
		}
		row("2 ... the same in means", fmt.Sprintf("%.0f", medianOf(res.goal2, func(g goal2Round) float64 { return us(g.mean.file) })),
			fmt.Sprintf("probe %.0f + nethttp %.0f + %.0f",
				medianOf(res.goal2, func(g goal2Round) float64 { return us(g.mean.probe) }),
				medianOf(res.goal2, func(g goal2Round) float64 { return us(g.mean.net) }), us(goal2Slack)), false, false)
		row("2 ... named: syncs' worth per action over nethttp", fmt.Sprintf("%.2f",
			medianOf(res.goal2, func(g goal2Round) float64 { return g.syncs(g.file) })), "1", false, false)
		row("2 ... unnamed: µs per action (p50); syncs' worth", fmt.Sprintf("%.0f; %.2f",
			medianOf(res.goal2, func(g goal2Round) float64 { return us(g.unnamed) }),
			medianOf(res.goal2, func(g goal2Round) float64 { return g.syncs(g.unnamed) })), "as close to 1 as the guarantees allow", false, false)
	}
	if q := res.fileVsMemory(64, bench.IdemFile); len(q) > 0 {
		row("3 file journal, concurrency 64, named: actions/s vs memory journal", fmt.Sprintf("%.2fx", median(q)), ">= 0.80x", median(q) >= 0.8, true)
		row("3 ... unnamed vs memory journal", fmt.Sprintf("%.2fx", median(res.fileVsMemory(64, bench.E2EFileUnnamed))), "", false, false)
		cpu, use := res.e2eCPU[64], res.e2eUse[64]
		row("3 ... CPU µs per action, file named vs memory; cores busy", fmt.Sprintf("%.0f vs %.0f; %.2f vs %.2f",
			median(cpu[bench.IdemFile]), median(cpu[bench.IdemMemory]), median(use[bench.IdemFile]), median(use[bench.IdemMemory])),
			fmt.Sprintf("(%d cores)", runtime.NumCPU()), false, false)
	}
	if cpu, ok := pm("large", bench.IdemMemory, cpuQ); ok {
		rh, okR := pm("large", bench.RetryableHTTP, cpuQ)
		fs, okF := pm("large", bench.Failsafe, cpuQ)
		if okR && okF {
			row("4 8 MiB POST with GetBody, loopback: CPU vs net/http", fmt.Sprintf("%.2fx", cpu),
				fmt.Sprintf("<= %.2fx (better of retryablehttp %.2fx, failsafe %.2fx)", min(rh, fs), rh, fs), cpu <= min(rh, fs), true)
		}
	}
	if len(res.body[bench.IdemMemory]) > 0 {
		_, named := res.bodyOver(bench.IdemMemory)
		_, unnamed := res.bodyOver(bench.BodyUnnamed)
		sha, _ := res.bodyOver(sha256Name)
		row("4 idemretry's extra CPU per MiB over net/http (no network)",
			fmt.Sprintf("named %+.0f µs, unnamed %+.0f µs", named, unnamed), fmt.Sprintf("(SHA-256 alone: %.0f µs/MiB)", sha), false, false)
	}
	if len(res.recovery) > 0 {
		m := medianRecovery(res.recovery)
		row(fmt.Sprintf("5 recovery of %d records, page cache warm: Open", m.Records), fmt.Sprintf("%.2f s", m.Open.Seconds()),
			"<= 1.2 s", m.Open <= 1200*time.Millisecond, true)
		row("5 ... peak heap during Open", fmt.Sprintf("%.0f MB", mb(m.Peak)), "< 150 MB", mb(m.Peak) < 150, true)
		row("5 ... allocated during Open; retained", fmt.Sprintf("%.0f MB; %.0f MB", mb(m.Allocated), mb(m.Retained)), "", false, false)
		if len(res.cold) > 0 {
			c := medianRecovery(res.cold)
			row("5 ... page cache dropped: Open", fmt.Sprintf("%.2f s", c.Open.Seconds()), "", false, false)
		}
	}
	w.Flush()
}
