package bench

import (
	"bytes"
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/internal/procstat"
)

// Body sizes of the benchmarks.
const (
	SmallBody = 1 << 10 // a payment request
	LargeBody = 8 << 20 // an upload: streamed by idemretry, buffered by the peers
)

// actionSeq numbers actions across runs, so that no two share an id, even
// in one journal.
var actionSeq atomic.Int64

// run is one benchmark's server, client and payload.
type run struct {
	srv     *Server
	c       *Client
	payload []byte
	flaky   bool
	conns   int64 // connections accepted before the timer started
	reqs    int64
	cpu     time.Duration // process CPU time when the timer started
	ids     *actionIDs    // made before the timer starts, for every client (one live heap for all)
	useIDs  bool          // the client or the server needs an action id
}

func start(b *testing.B, name string, size int64, flaky bool) *run {
	b.Helper()
	srv := NewServer(size, flaky)
	c, err := NewClient(name, b.TempDir())
	if err != nil {
		srv.Close()
		if name == IdemFile {
			b.Skipf("file journal unavailable: %v", err)
		}
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); srv.Close() })
	r := &run{srv: srv, c: c, payload: payload(size), flaky: flaky, useIDs: c.Keyed || flaky}
	// The warm-up, then one per action of the loop. Every client holds them,
	// used or not, so that none runs with a smaller live heap (and so fewer
	// garbage collections) than another.
	r.ids = newActionIDs(b.N + 1)
	// One warm-up request, so that the first dial is not measured.
	if err := r.op(context.Background()); err != nil {
		b.Fatal(err)
	}
	r.conns, r.reqs = srv.Conns(), srv.Requests()
	b.ReportAllocs()
	if size >= LargeBody {
		b.SetBytes(size)
	}
	r.cpu = procstat.CPUTime()
	b.ResetTimer()
	return r
}

// op performs one logical action. Only idemretry and the flaky server need
// an action id; the others do not pay for making one.
func (r *run) op(ctx context.Context) error {
	var id string
	if r.useIDs {
		id = r.ids.next()
	}
	return r.c.Post(ctx, r.srv.URL, r.payload, id, r.flaky)
}

// actionIDs are the ids of a benchmark's actions, made before its timer
// starts. An application has its action's id already (the order it pays
// for), so making one is not a cost of the Transport: it was formatted in
// the timed loop before the performance work (one to two allocations per action,
// counted against idemretry alone). WithAction's own cost is still
// measured: Client.Post calls it for every action. The ids are
// "pay:" and a number unique in the process, zero-padded to a fixed width
// so that they are substrings of one string: 16 bytes of heap per action,
// without pointers for the garbage collector to scan.
type actionIDs struct {
	text string
	n    atomic.Int64 // ids handed out
}

const idWidth = 16 // "pay:" and 12 digits

func newActionIDs(n int) *actionIDs {
	first := actionSeq.Add(int64(n)) - int64(n) + 1
	b := make([]byte, 0, n*idWidth)
	for i := range int64(n) {
		b = append(b, "pay:"...)
		b = appendPadded(b, first+i, idWidth-len("pay:"))
	}
	return &actionIDs{text: string(b)}
}

// next returns the next id; past the ids made, it makes one (a loop that
// ran more actions than planned).
func (ids *actionIDs) next() string {
	i := int(ids.n.Add(1) - 1)
	if (i+1)*idWidth > len(ids.text) {
		return "pay:" + strconv.FormatInt(actionSeq.Add(1), 10)
	}
	return ids.text[i*idWidth : (i+1)*idWidth]
}

// appendPadded appends v in decimal, zero-padded to width digits.
func appendPadded(b []byte, v int64, width int) []byte {
	var d [20]byte
	s := strconv.AppendInt(d[:0], v, 10)
	for range width - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// finish stops the timer, reports CPU time, connections and server
// requests per action, and fails the benchmark if a body arrived damaged or a retry
// changed key.
func (r *run) finish(b *testing.B) {
	b.StopTimer()
	n := float64(b.N)
	// Client and server together: the server is the same for every client.
	b.ReportMetric(float64(procstat.CPUTime()-r.cpu)/n, "cpu-ns/op")
	b.ReportMetric(float64(r.srv.Conns()-r.conns)/n, "dials/op")
	b.ReportMetric(float64(r.srv.Requests()-r.reqs)/n, "reqs/op")
	if bad := r.srv.BadBodies(); bad > 0 {
		b.Fatalf("%d request bodies arrived damaged", bad)
	}
	if bad := r.srv.KeyMismatches(); bad > 0 {
		b.Fatalf("%d retries changed Idempotency-Key", bad)
	}
}

func (r *run) loop(b *testing.B) {
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		if err := r.op(ctx); err != nil {
			b.Fatal(err)
		}
	}
	r.finish(b)
}

// parallelism times GOMAXPROCS goroutines send at once in PostParallel:
// enough to keep the file journal's group commit busy on a 2-core machine.
const parallelism = 4

func (r *run) parallel(b *testing.B) {
	ctx := context.Background()
	b.SetParallelism(parallelism)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := r.op(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	r.finish(b)
}

// Post: one 1 KiB POST answered 201, each a new action.
func Post(b *testing.B, name string) { start(b, name, SmallBody, false).loop(b) }

// PostParallel: Post from 4*GOMAXPROCS goroutines at once.
func PostParallel(b *testing.B, name string) { start(b, name, SmallBody, false).parallel(b) }

// Retry: the server answers 503 to each action's first attempt and 201 to
// its second; no client waits between them.
func Retry(b *testing.B, name string) { start(b, name, SmallBody, true).loop(b) }

// Large: one 8 MiB POST whose request has GetBody, answered 201.
func Large(b *testing.B, name string) { start(b, name, LargeBody, false).loop(b) }

// payload returns size bytes of JSON-looking text, the same every time, so
// that the server can check a body without being sent a copy.
func payload(size int64) []byte {
	p := bytes.Repeat([]byte(`{"amount":1000,"currency":"usd","source":"tok_visa"}`+"\n"), int(size)/52+1)
	return p[:size]
}
