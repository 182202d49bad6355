package main

import (
	"fmt"
	"os"
	"testing"
	"text/tabwriter"

	"github.com/idemretry/idemretry/bench"
)

const mib = 1 << 20

// sha256Name keys SHA-256's own figures among the body case's clients.
const sha256Name = "sha256"

// runBody measures the 8 MiB POST over a stub (no network) for each of
// bench.BodyNames, and SHA-256 alone, and prints CPU µs per MiB and each
// idemretry client's extra per MiB over net/http in this round.
func (res *results) runBody(round int) {
	fmt.Printf("\nround %d, body (8 MiB POST with GetBody over a stub that reads it; no network)\n", round)
	cpu := map[string]float64{}
	for _, name := range append(bench.BodyNames, sha256Name) {
		r := testing.Benchmark(func(b *testing.B) {
			if name == sha256Name {
				bench.SHA256(b)
			} else {
				bench.BodyCost(b, name)
			}
		})
		if r.N == 0 {
			fmt.Printf("%s: failed\n", name)
			continue
		}
		cpu[name] = r.Extra["cpu-ns/op"]
		res.body[name] = append(res.body[name], r.Extra["cpu-ns/op"])
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "client\tcpu µs/MiB\tover nethttp µs/MiB\t")
	for _, name := range append(bench.BodyNames, sha256Name) {
		if _, ok := cpu[name]; !ok {
			continue
		}
		over := ""
		if name != bench.NetHTTP && name != sha256Name {
			over = fmt.Sprintf("%+.0f", perMiB(cpu[name]-cpu[bench.NetHTTP]))
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t\n", name, perMiB(cpu[name]), over)
	}
	w.Flush()
}

// perMiB turns CPU ns per 8 MiB action into µs per MiB.
func perMiB(ns float64) float64 { return ns / 1e3 / (bench.LargeBody / mib) }

// bodyOver returns the median over rounds of name's CPU per MiB, and of its
// extra over net/http in the same round.
func (res *results) bodyOver(name string) (own, over float64) {
	base, rs := res.body[bench.NetHTTP], res.body[name]
	var d []float64
	for i := range min(len(base), len(rs)) {
		d = append(d, perMiB(rs[i]-base[i]))
	}
	var o []float64
	for _, v := range rs {
		o = append(o, perMiB(v))
	}
	return median(o), median(d)
}

func (res *results) printBodyMedians() {
	if len(res.body) == 0 {
		return
	}
	fmt.Println("\nbody: median CPU per MiB of an 8 MiB POST with GetBody, no network")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "client\tcpu µs/MiB\tover nethttp µs/MiB\t")
	for _, name := range append(bench.BodyNames, sha256Name) {
		if len(res.body[name]) == 0 {
			continue
		}
		own, over := res.bodyOver(name)
		o := fmt.Sprintf("%+.0f", over)
		if name == bench.NetHTTP || name == sha256Name {
			o = ""
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t\n", name, own, o)
	}
	w.Flush()
}
