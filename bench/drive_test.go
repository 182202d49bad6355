package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
)

// TestDrive sends BENCH_DRIVE_N (default 20000) actions of the Post case
// (one 1 KiB POST over loopback, each a new action) with the client named
// by BENCH_DRIVE, after BENCH_DRIVE_WARM (default 500) warm-up actions, one
// at a time. It measures nothing itself: it is the driver for an
// instruction count under callgrind, which is repeatable where timing on a
// shared machine is not. Run it once with N=0 and once with N=20000 and
// subtract, per client:
//
//	go -C bench test -c -o /tmp/drive.test .
//	BENCH_DRIVE=idemretry-memory BENCH_DRIVE_N=20000 GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 \
//	  valgrind --tool=callgrind --callgrind-out-file=cg.out /tmp/drive.test -test.run '^TestDrive$'
//
// or bench/callgrind/run.sh, which does both runs and the subtraction, and
// bench/callgrind/diff.py, which compares two clients function by function.
//
// (Without asyncpreemptoff, callgrind 3.19 may abort on the runtime's
// preemption signals.) Valgrind hides the CPU's SHA extensions, so SHA-256
// runs its AVX2 code there, about 38,000 instructions per 1 KiB
// fingerprint: subtract crypto/internal/fips140/sha256.blockAVX2 to
// compare with what runs natively.
//
// Skipped unless BENCH_DRIVE is set.
func TestDrive(t *testing.T) {
	name := os.Getenv("BENCH_DRIVE")
	if name == "" {
		t.Skip("BENCH_DRIVE not set: a driver for callgrind, not a test")
	}
	n := envInt(t, "BENCH_DRIVE_N", 20000)
	warm := envInt(t, "BENCH_DRIVE_WARM", 500)
	srv := NewServer(SmallBody, false)
	defer srv.Close()
	c, err := NewClient(name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &run{srv: srv, c: c, payload: payload(SmallBody), useIDs: c.Keyed}
	// Every client holds all the ids, as in the benchmarks: one live heap.
	r.ids = newActionIDs(20000 + warm)
	ctx := context.Background()
	for i := 0; i < warm+n; i++ {
		if err := r.op(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := srv.Requests(), int64(warm+n); got != want {
		t.Fatalf("server answered %d requests, want %d", got, want)
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}
