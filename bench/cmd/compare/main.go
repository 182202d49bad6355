// Command compare runs the bench package's measurements in one process and
// prints each client's figures as ratios against plain net/http measured in
// the same round, then a summary of the performance goals (bench/README.md). On a shared, noisy
// machine a ratio taken minutes apart means little; one taken seconds apart,
// repeated over several rounds, does.
//
//	go run ./cmd/compare -rounds 3 -benchtime 1s
//
// Cases (-cases, comma-separated; all by default):
//
//	post      1 KiB POST answered 201, a new action each time (testing.Benchmark)
//	parallel  the same from 4×GOMAXPROCS goroutines
//	retry     503 then 201 per action, zero backoff for everyone
//	large     8 MiB POST with GetBody over loopback
//	body      the same 8 MiB POST over a stub that drains it, no network:
//	          idemretry's extra CPU per MiB, and SHA-256 per MiB
//	e2e       actions/s at 1, 16 and 64 goroutines: net/http, idemretry with
//	          the memory journal, the file journal with named and unnamed actions;
//	          and the process's CPU per action and cores busy while each ran
//	          (a journal that leaves cores idle while it syncs shows there)
//	probe     raw write+fdatasync in the same file system, interleaved with
//	          e2e at concurrency 1 (alone if e2e is not run); with e2e, also
//	          a sync then a net/http request in turn (probe+nethttp)
//	recovery  filejournal.Open of 1M records in a fresh process: time, bytes
//	          allocated, peak heap; page cache warm and dropped
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/idemretry/idemretry/bench"
)

// benchCases are the cases run with testing.Benchmark, each client paired
// with a net/http run right next to it.
var benchCases = []struct {
	name string
	f    func(*testing.B, string)
}{
	{"post", bench.Post},
	{"parallel", bench.PostParallel},
	{"retry", bench.Retry},
	{"large", bench.Large},
}

const allCases = "post,parallel,retry,large,body,e2e,probe,recovery"

// ratios of one client against the baseline run next to it, and the
// client's own figures, to compare clients with each other.
type ratios struct {
	time, cpu, bytes, allocs float64
	cpuNs, bPerOp, allocsOp  float64
}

// results holds every round's figures until the medians are taken.
type results struct {
	pairs    map[string][]ratios // "case/client"
	body     map[string][]float64
	e2e      map[int]map[string][]float64 // concurrency -> participant -> actions/s
	e2eRatio map[int]map[string][]float64 // ... -> ratio to net/http in its round
	e2eCPU   map[int]map[string][]float64 // ... -> µs of CPU per action (the process's)
	e2eUse   map[int]map[string][]float64 // ... -> cores busy: CPU time per wall time
	goal2    []goal2Round
	probe    []float64 // µs per sync
	recovery []bench.RecoveryResult
	cold     []bench.RecoveryResult
}

func main() {
	testing.Init() // registers test.benchtime, which testing.Benchmark reads
	rounds := flag.Int("rounds", 3, "rounds; each runs every case and client once")
	benchtime := flag.String("benchtime", "1s", "per benchmark, as for go test; per participant and concurrency in e2e")
	only := flag.String("cases", allCases, "comma-separated cases")
	sliceN := flag.Int("slices", 10, "e2e: interleaved slices per participant and concurrency")
	records := flag.Int("records", bench.RecoveryRecords, "recovery: records in the journal")
	label := flag.String("commit", "", "what is measured, for the header (default: git describe of the working directory)")
	child := flag.String("recovery-open", "", "internal: measure one filejournal.Open of this directory and print it")
	flag.Parse()
	if *child != "" {
		os.Exit(openChild(*child))
	}
	if err := flag.Set("test.benchtime", *benchtime); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	d, err := time.ParseDuration(*benchtime)
	if err != nil {
		fmt.Fprintf(os.Stderr, "-benchtime %q: e2e needs a duration: %v\n", *benchtime, err)
		os.Exit(2)
	}
	want := strings.Split(*only, ",")
	for _, c := range want {
		if !strings.Contains(","+allCases+",", ","+c+",") {
			fmt.Fprintf(os.Stderr, "unknown case %q (cases: %s)\n", c, allCases)
			os.Exit(2)
		}
	}
	has := func(c string) bool { return slices.Contains(want, c) }

	fmt.Printf("%s %s/%s cores=%d GOMAXPROCS=%d benchtime=%s rounds=%d %s\n", runtime.Version(), runtime.GOOS,
		runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), *benchtime, *rounds, time.Now().UTC().Format(time.RFC3339))
	if *label == "" {
		*label = commit()
	}
	fmt.Printf("commit %s; temp dir %s%s\n", *label, os.TempDir(), loadAverage())
	fmt.Println("each client is paired with a nethttp run right next to it; ratios are client/nethttp")

	res := &results{pairs: map[string][]ratios{}, body: map[string][]float64{},
		e2e: map[int]map[string][]float64{}, e2eRatio: map[int]map[string][]float64{},
		e2eCPU: map[int]map[string][]float64{}, e2eUse: map[int]map[string][]float64{}}
	var rec *recoveryFixture
	if has("recovery") {
		if rec, err = newRecoveryFixture(*records); err != nil {
			fmt.Fprintln(os.Stderr, "recovery:", err)
			os.Exit(1)
		}
		defer rec.Close()
	}
	for round := 1; round <= *rounds; round++ {
		for _, c := range benchCases {
			if has(c.name) {
				res.runPairs(round, c.name, c.f)
			}
		}
		if has("body") {
			res.runBody(round)
		}
		if has("e2e") || has("probe") {
			if err := res.runE2E(round, d, *sliceN, has("e2e"), has("probe")); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
				os.Exit(1)
			}
		}
		if rec != nil {
			if err := res.runRecovery(round, rec); err != nil {
				fmt.Fprintln(os.Stderr, "recovery:", err)
				os.Exit(1)
			}
		}
	}
	fmt.Printf("\n===== medians over %d rounds =====\n", *rounds)
	res.printPairMedians()
	res.printBodyMedians()
	res.printE2EMedians()
	res.printRecoveryMedians()
	res.printGoals(*rounds)
}

// commit names the checked-out commit of the repository around the working
// directory, "+dirty" if files differ from it.
func commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty=+dirty", "--abbrev=12").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// loadAverage returns "; load average" and the system's 1, 5 and 15 minute
// load averages where /proc/loadavg tells them: a busy machine's figures
// are read with that in mind.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return "; load average " + strings.Join(f[:3], " ")
	}
	return ""
}

// clientsOf returns the clients a testing.Benchmark case compares with
// the baseline: every one, and in the 1 KiB POST case the peers with a key
// set by hand too.
func clientsOf(name string) []string {
	if name == "post" {
		return append(slices.Clone(bench.Names[1:]), bench.KeyedPeerNames...)
	}
	return bench.Names[1:]
}

func (res *results) runPairs(round int, name string, f func(*testing.B, string)) {
	fmt.Printf("\nround %d, %s\n", round, name)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "client\tnethttp ns/op\tns/op\tcpu-ns/op\tB/op\tallocs/op\tdials/op\ttime\tcpu\tB/op\tallocs\t")
	for _, client := range clientsOf(name) {
		base, r := pair(f, client, round)
		if base.N == 0 || r.N == 0 {
			fmt.Fprintf(w, "%s\tfailed or skipped\t\t\t\t\t\t\t\t\t\t\n", client)
			continue
		}
		q := ratios{
			time:     div(float64(r.NsPerOp()), float64(base.NsPerOp())),
			cpu:      div(r.Extra["cpu-ns/op"], base.Extra["cpu-ns/op"]),
			bytes:    div(float64(r.AllocedBytesPerOp()), float64(base.AllocedBytesPerOp())),
			allocs:   div(float64(r.AllocsPerOp()), float64(base.AllocsPerOp())),
			cpuNs:    r.Extra["cpu-ns/op"],
			bPerOp:   float64(r.AllocedBytesPerOp()),
			allocsOp: float64(r.AllocsPerOp()),
		}
		res.pairs[name+"/"+client] = append(res.pairs[name+"/"+client], q)
		fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t%d\t%d\t%.3f\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t\n", client,
			base.NsPerOp(), r.NsPerOp(), r.Extra["cpu-ns/op"], r.AllocedBytesPerOp(), r.AllocsPerOp(),
			r.Extra["dials/op"], q.time, q.cpu, q.bytes, q.allocs)
	}
	w.Flush()
}

func (res *results) printPairMedians() {
	if len(res.pairs) == 0 {
		return
	}
	fmt.Printf("\nmedian ratio vs %s (testing.Benchmark cases)\n", bench.NetHTTP)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "case\tclient\ttime\tcpu\tB/op\tallocs/op\tB/op\tallocs/op\t")
	for _, c := range benchCases {
		for _, client := range clientsOf(c.name) {
			rs := res.pairs[c.name+"/"+client]
			if len(rs) == 0 {
				continue
			}
			fmt.Fprintf(w, "%s\t%s\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t%.0f\t%.0f\t\n", c.name, client,
				medianOf(rs, func(r ratios) float64 { return r.time }),
				medianOf(rs, func(r ratios) float64 { return r.cpu }),
				medianOf(rs, func(r ratios) float64 { return r.bytes }),
				medianOf(rs, func(r ratios) float64 { return r.allocs }),
				medianOf(rs, func(r ratios) float64 { return r.bPerOp }),
				medianOf(rs, func(r ratios) float64 { return r.allocsOp }))
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

func medianOf[T any](rs []T, f func(T) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return median(v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
