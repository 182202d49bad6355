// Command compare runs the bench package's benchmarks in one process and
// prints each client's time, bytes and allocations per action as ratios
// against plain net/http measured in the same round. On a shared, noisy
// machine a ratio taken minutes apart means little; one taken seconds apart,
// repeated over several rounds, does.
//
//	go run ./cmd/compare -rounds 5 -benchtime 1s
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/idemretry/idemretry/bench"
)

var cases = []struct {
	name string
	f    func(*testing.B, string)
}{
	{"post", bench.Post},
	{"parallel", bench.PostParallel},
	{"retry", bench.Retry},
	{"large", bench.Large},
}

// ratios of one client against the baseline run next to it.
type ratios struct{ time, cpu, bytes, allocs float64 }

func main() {
	testing.Init() // registers test.benchtime, which testing.Benchmark reads
	rounds := flag.Int("rounds", 5, "rounds; each runs every case and client once")
	benchtime := flag.String("benchtime", "1s", "per benchmark, as for go test")
	only := flag.String("cases", "post,parallel,retry,large", "comma-separated cases")
	flag.Parse()
	if err := flag.Set("test.benchtime", *benchtime); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("%s %s/%s GOMAXPROCS=%d benchtime=%s %s\n", runtime.Version(), runtime.GOOS,
		runtime.GOARCH, runtime.GOMAXPROCS(0), *benchtime, time.Now().Format(time.RFC3339))
	fmt.Println("each client is paired with a nethttp run right next to it; ratios are client/nethttp")

	want := strings.Split(*only, ",")
	seen := map[string][]ratios{} // case/client -> one entry per round
	for round := 1; round <= *rounds; round++ {
		for _, c := range cases {
			if !slices.Contains(want, c.name) {
				continue
			}
			fmt.Printf("\nround %d, %s\n", round, c.name)
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(w, "client\tnethttp ns/op\tns/op\tcpu-ns/op\tB/op\tallocs/op\tdials/op\ttime\tcpu\tB/op\tallocs\t")
			for _, name := range bench.Names[1:] {
				base, r := pair(c.f, name, round)
				if base.N == 0 || r.N == 0 {
					fmt.Fprintf(w, "%s\tfailed or skipped\t\t\t\t\t\t\t\t\t\t\n", name)
					continue
				}
				q := ratios{
					time:   div(float64(r.NsPerOp()), float64(base.NsPerOp())),
					cpu:    div(r.Extra["cpu-ns/op"], base.Extra["cpu-ns/op"]),
					bytes:  div(float64(r.AllocedBytesPerOp()), float64(base.AllocedBytesPerOp())),
					allocs: div(float64(r.AllocsPerOp()), float64(base.AllocsPerOp())),
				}
				seen[c.name+"/"+name] = append(seen[c.name+"/"+name], q)
				fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t%d\t%d\t%.3f\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t\n", name,
					base.NsPerOp(), r.NsPerOp(), r.Extra["cpu-ns/op"], r.AllocedBytesPerOp(), r.AllocsPerOp(),
					r.Extra["dials/op"], q.time, q.cpu, q.bytes, q.allocs)
			}
			w.Flush()
		}
	}
	fmt.Printf("\nmedian ratio vs %s over %d rounds\n", bench.NetHTTP, *rounds)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "case\tclient\ttime\tcpu\tB/op\tallocs/op\t")
	for _, c := range cases {
		for _, name := range bench.Names[1:] {
			rs := seen[c.name+"/"+name]
			if len(rs) == 0 {
				continue
			}
			fmt.Fprintf(w, "%s\t%s\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t\n", c.name, name,
				median(rs, func(r ratios) float64 { return r.time }),
				median(rs, func(r ratios) float64 { return r.cpu }),
				median(rs, func(r ratios) float64 { return r.bytes }),
				median(rs, func(r ratios) float64 { return r.allocs }))
		}
	}
	w.Flush()
}

// pair runs the baseline and the named client back to back, baseline first
// in odd rounds and second in even ones, so that a machine getting busier
// or quieter favours neither.
func pair(f func(*testing.B, string), name string, round int) (base, r testing.BenchmarkResult) {
	run := func(n string) testing.BenchmarkResult {
		return testing.Benchmark(func(b *testing.B) { f(b, n) })
	}
	if round%2 == 1 {
		base = run(bench.NetHTTP)
		return base, run(name)
	}
	r = run(name)
	return run(bench.NetHTTP), r
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func median(rs []ratios, f func(ratios) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
