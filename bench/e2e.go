package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/internal/procstat"
)

// End to end: actions per second, 1 KiB POSTs answered 201 at once by a
// loopback server, from 1, 16 or 64 goroutines that each send one action
// after another, through plain net/http and through idemretry with its
// memory journal and with its default file journal (the e2e table of README.md).

// Participants of the end-to-end measurement, and of ProbeName.
const (
	// E2EFileUnnamed is idemretry with the file journal and no action id:
	// each POST carries a body of its own, so that the Transport names it
	// by a fingerprint (method, URL, body) no earlier action had, and it is
	// a new action whose "done" is synced before RoundTrip returns.
	E2EFileUnnamed = "idemretry-file-unnamed"
	// ProbeName is the raw write+fdatasync Probe, interleaved with the
	// others at concurrency 1.
	ProbeName = "probe"
	// ProbeThenNetHTTP is a Probe sync, then a plain net/http request, one
	// after the other on one goroutine: the floor under a new action that is
	// made durable and then sent, as this machine runs it. It is more than
	// the Probe and net/http measured apart (by 15 to 36 µs in the runs
	// that introduced it, on 2 cores): a request right after a sync is
	// slower than one right after another request, the threads and cores
	// that idled through the sync being woken again.
	ProbeThenNetHTTP = "probe+nethttp"
	// ProbeHandoffThenNetHTTP is ProbeThenNetHTTP with the sync handed to
	// a goroutine of its own, which the caller waits for on a channel, as a
	// journal whose syncs are not made on the caller's goroutine has it
	// (the file journal's committer; a caller's wait must end with its
	// context, which a sync on its own goroutine could not): the floor of
	// such a design, hand-over and hand-back included. In the run that
	// introduced it (go -C bench run ./cmd/compare -cases e2e,probe
	// -rounds 5, 2 cores), it took 3 µs more than ProbeThenNetHTTP (median
	// of the rounds' medians; +1 to +11 µs per round), and the file
	// journal's named action 23 µs more than it.
	ProbeHandoffThenNetHTTP = "probe-handoff+nethttp"
)

// E2ENames lists the end-to-end participants, baseline first. IdemMemory
// and IdemFile name each action with WithAction.
var E2ENames = []string{NetHTTP, IdemMemory, IdemFile, E2EFileUnnamed}

// E2EConcurrency is the number of goroutines of each row of the table.
var E2EConcurrency = []int{1, 16, 64}

// actor performs one action per call, from many goroutines at once.
type actor interface {
	act(ctx context.Context, seq int64) error
}

// postActor sends 1 KiB POSTs through one client. A named one gives each
// action its id with WithAction (Client.Post); an unnamed one sends a body
// no other action has, and no id.
type postActor struct {
	c       *Client
	url     string
	unnamed bool
}

func (a *postActor) act(ctx context.Context, seq int64) error {
	if a.unnamed {
		return a.c.Post(ctx, a.url, uniquePayload(SmallBody, seq), "", false)
	}
	var id string
	if a.c.Keyed {
		id = "pay:" + strconv.FormatInt(seq, 10)
	}
	return a.c.Post(ctx, a.url, smallPayload, id, false)
}

var smallPayload = payload(SmallBody)

// uniquePayload is payload(size) whose first 20 bytes are seq, zero-padded:
// a body no other seq has, of the same length. It is a new slice: a body
// may still be read after Post returns (net/http closes it when it likes).
func uniquePayload(size int64, seq int64) []byte {
	p := append([]byte(nil), payload(size)...)
	stampSeq(p, seq)
	return p
}

// stampSeq writes seq, zero-padded to 20 digits, over the start of p.
func stampSeq(p []byte, seq int64) {
	var d [20]byte
	s := strconv.AppendInt(d[:0], seq, 10)
	n := copy(p, "00000000000000000000"[:20-len(s)])
	copy(p[n:], s)
}

type probeActor struct{ p *Probe }

func (a probeActor) act(context.Context, int64) error { return a.p.Sync() }

// syncer makes Probe syncs on a goroutine of its own: each request is a
// channel on which the sync's error is sent once it returned.
type syncer struct {
	p    *Probe
	reqs chan chan error
	done chan struct{}
}

func newSyncer(p *Probe) *syncer {
	s := &syncer{p: p, reqs: make(chan chan error), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for reply := range s.reqs {
			reply <- p.Sync()
		}
	}()
	return s
}

// sync hands one sync to the syncer's goroutine and waits for it.
func (s *syncer) sync() error {
	reply := make(chan error, 1)
	s.reqs <- reply
	return <-reply
}

// close stops the syncer's goroutine and waits for it.
func (s *syncer) close() error {
	close(s.reqs)
	<-s.done
	return nil
}

// handoffThenPost has its syncer sync the probe, then sends a plain
// net/http request.
type handoffThenPost struct {
	s    *syncer
	post *postActor
}

func (a handoffThenPost) act(ctx context.Context, seq int64) error {
	if err := a.s.sync(); err != nil {
		return err
	}
	return a.post.act(ctx, seq)
}

// probeThenPost syncs its probe, then sends a plain net/http request.
type probeThenPost struct {
	p    *Probe
	post *postActor
}

func (a probeThenPost) act(ctx context.Context, seq int64) error {
	if err := a.p.Sync(); err != nil {
		return err
	}
	return a.post.act(ctx, seq)
}

// Sample is what one participant did: actions completed in elapsed wall
// time (from the first goroutine's start to the last one's return), the
// CPU time the process used meanwhile (the server's included, as it is in
// every participant's), and, at concurrency 1, how long each action took.
type Sample struct {
	Actions   int64
	Elapsed   time.Duration
	CPU       time.Duration   // user and system; 0 where procstat.CPUTime cannot tell
	Latencies []time.Duration // at concurrency 1 only, in no order
}

// CPUPerAction returns the CPU time per action (0 without a CPU reading).
func (s Sample) CPUPerAction() time.Duration {
	if s.Actions == 0 {
		return 0
	}
	return s.CPU / time.Duration(s.Actions)
}

// CPUUse returns the CPU time used per wall time: 2 is both of two cores
// busy throughout (0 without a CPU reading). A participant that keeps the
// cores idle while it waits (on a sync, say) uses less than the cores.
func (s Sample) CPUUse() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return s.CPU.Seconds() / s.Elapsed.Seconds()
}

// PerSecond returns the actions per second.
func (s Sample) PerSecond() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Actions) / s.Elapsed.Seconds()
}

// PerAction returns the mean wall time per action (of one goroutine's
// action at concurrency 1).
func (s Sample) PerAction() time.Duration {
	if s.Actions == 0 {
		return 0
	}
	return s.Elapsed / time.Duration(s.Actions)
}

// P50 returns the median of Latencies (0 without them). Unlike PerAction,
// it does not move with the few syncs that a busy disk stalls for
// milliseconds.
func (s Sample) P50() time.Duration {
	if len(s.Latencies) == 0 {
		return 0
	}
	l := slices.Clone(s.Latencies)
	slices.Sort(l)
	return l[len(l)/2]
}

func (s Sample) add(o Sample) Sample {
	return Sample{Actions: s.Actions + o.Actions, Elapsed: s.Elapsed + o.Elapsed, CPU: s.CPU + o.CPU,
		Latencies: append(s.Latencies, o.Latencies...)}
}

// seq numbers the end-to-end actions: ids and bodies never repeat in a
// process.
var e2eSeq atomic.Int64

// drive runs conc goroutines that perform actions with a until d has
// passed; each finishes the action it is in. The first error stops them
// all and is returned. At concurrency 1 it times each action too.
func drive(a actor, conc int, d time.Duration) (Sample, error) {
	var (
		stop  atomic.Bool
		total atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
		lat   []time.Duration
	)
	ctx := context.Background()
	cpu0 := procstat.CPUTime()
	start := time.Now()
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			for !stop.Load() {
				var t0 time.Time
				if conc == 1 {
					t0 = time.Now()
				}
				if err := a.act(ctx, e2eSeq.Add(1)); err != nil {
					once.Do(func() { first = err })
					stop.Store(true)
					break
				}
				if conc == 1 {
					lat = append(lat, time.Since(t0))
				}
				n++
			}
			total.Add(n)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	return Sample{Actions: total.Load(), Elapsed: elapsed, CPU: procstat.CPUTime() - cpu0, Latencies: lat}, first
}

// E2E is the setup of one end-to-end measurement: a loopback server that
// answers at once, and each participant's client, file journal (in a
// directory of its own under one temporary directory) or probe.
type E2E struct {
	srv    *Server
	dir    string
	names  []string
	actors map[string]actor
	closer []func() error
}

// NewE2E starts the server and the participants named (from E2ENames,
// ProbeName, ProbeThenNetHTTP and ProbeHandoffThenNetHTTP). Close releases them and removes their
// directories.
func NewE2E(names []string) (*E2E, error) { return newE2E(names, NewServer(SmallBody, false)) }

// newE2E is NewE2E with the given server, which Close closes.
func newE2E(names []string, srv *Server) (*E2E, error) {
	dir, err := os.MkdirTemp("", "idemretry-e2e-")
	if err != nil {
		srv.Close()
		return nil, err
	}
	e := &E2E{srv: srv, dir: dir, names: names, actors: map[string]actor{}}
	for _, name := range names {
		if err := e.add(name); err != nil {
			e.Close()
			return nil, fmt.Errorf("e2e %s: %w", name, err)
		}
	}
	return e, nil
}

func (e *E2E) add(name string) error {
	sub := filepath.Join(e.dir, name)
	if err := os.Mkdir(sub, 0o700); err != nil {
		return err
	}
	if name == ProbeName || name == ProbeThenNetHTTP || name == ProbeHandoffThenNetHTTP {
		p, err := NewProbe(sub)
		if err != nil {
			return err
		}
		e.closer = append(e.closer, p.Close)
		if name == ProbeName {
			e.actors[name] = probeActor{p}
			return nil
		}
		c, err := NewClient(NetHTTP, sub)
		if err != nil {
			return err
		}
		e.closer = append(e.closer, c.Close)
		if name == ProbeHandoffThenNetHTTP {
			s := newSyncer(p)
			// Closers run in order: the syncer stops before its probe's
			// file is closed.
			e.closer = append([]func() error{s.close}, e.closer...)
			e.actors[name] = handoffThenPost{s, &postActor{c: c, url: e.srv.URL}}
			return nil
		}
		e.actors[name] = probeThenPost{p, &postActor{c: c, url: e.srv.URL}}
		return nil
	}
	client := name
	if name == E2EFileUnnamed {
		client = IdemFile
	}
	c, err := NewClient(client, sub)
	if err != nil {
		return err
	}
	if name == E2EFileUnnamed {
		c.Keyed = false // Post then sets no action id
	}
	e.actors[name], e.closer = &postActor{c: c, url: e.srv.URL, unnamed: name == E2EFileUnnamed}, append(e.closer, c.Close)
	return nil
}

// Dir returns the temporary directory the participants' files are in.
func (e *E2E) Dir() string { return e.dir }

// Close stops the participants and the server and removes the directory.
func (e *E2E) Close() error {
	var errs []error
	for _, c := range e.closer {
		errs = append(errs, c())
	}
	e.srv.Close()
	errs = append(errs, os.RemoveAll(e.dir))
	return errors.Join(errs...)
}

// Measure runs every participant at concurrency conc for about d each, in
// slices of d/slices taken in turn (participant after participant, the
// first one rotating with rotate and the slice), so that all of them see
// the same machine and the same disk, however those drift. Before, each
// runs a short warm-up at conc (connections dialed, journals written
// once), not counted. It returns each participant's totals.
func (e *E2E) Measure(conc int, d time.Duration, slices, rotate int) (map[string]Sample, error) {
	slices = max(slices, 1)
	warm := min(d/10, 100*time.Millisecond)
	for _, name := range e.names {
		if _, err := drive(e.actors[name], conc, warm); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", name, err)
		}
	}
	out := make(map[string]Sample, len(e.names))
	k := len(e.names)
	for s := range slices {
		for i := range k {
			name := e.names[(i+s+rotate)%k]
			got, err := drive(e.actors[name], conc, d/time.Duration(slices))
			if err != nil {
				return nil, fmt.Errorf("%s at %d: %w", name, conc, err)
			}
			out[name] = out[name].add(got)
		}
	}
	if bad := e.srv.BadBodies(); bad > 0 {
		return nil, fmt.Errorf("%d request bodies arrived damaged", bad)
	}
	return out, nil
}
