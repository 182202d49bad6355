package sim

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// outcome is what running one history gave.
type outcome struct {
	h     *history
	viol  []violation
	ops   int // steps that acted (the others found nothing to act on)
	calls int
	trace []string
	err   error // the simulation itself failed (a journal that would not open)
}

// runHistory runs h once.
func runHistory(h *history, e env) (out outcome) {
	out.h = h
	r, err := newRunner(h, e)
	if err != nil {
		out.err = err
		return out
	}
	defer r.cleanup()
	defer func() {
		if p := recover(); p != nil {
			out.viol = append(out.viol, violation{check: "no-panic", msg: fmt.Sprintf("%v\n%s", p, debug.Stack())})
		}
	}()
	if err := r.run(); err != nil {
		out.err = err
	}
	out.viol = append(out.viol, r.viol...)
	out.ops = len(h.ops) - r.skipped
	out.calls = len(r.calls)
	out.trace = r.dump()
	return out
}

// stats counts a run of many histories.
type stats struct {
	histories, ops, calls atomic.Int64
	mu                    sync.Mutex
	// failures holds, for each check and known bug (or none), the first
	// history that broke it.
	failures []failure
	byCheck  map[string]int
	errs     []string
	// unavailable counts the histories that could not start a process
	// because the database did not answer in time (journal.ErrUnavailable
	// from sqljournal.Open: a machine too loaded to serve its PostgreSQL),
	// and unavailableMsg is the first one's error.
	unavailable    int
	unavailableMsg string
	// kinds counts the histories by journal and network.
	kinds map[string]int
}

type failure struct {
	o     outcome
	check string
	known string // the knownBugs issue it matches, or ""
	first violation
}

// classify says which known bug v is, or "".
var classify = func(v violation) string { return "" }

func (s *stats) add(o outcome) {
	s.histories.Add(1)
	s.ops.Add(int64(o.ops))
	s.calls.Add(int64(o.calls))
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case o.err != nil && errors.Is(o.err, journal.ErrUnavailable):
		if s.unavailable == 0 {
			s.unavailableMsg = fmt.Sprintf("seed %d: %v", o.h.seed, o.err)
		}
		s.unavailable++
	case o.err != nil && len(s.errs) < 10:
		s.errs = append(s.errs, fmt.Sprintf("seed %d: %v", o.h.seed, o.err))
	}
	if s.byCheck == nil {
		s.byCheck = map[string]int{}
		s.kinds = map[string]int{}
	}
	kind := o.h.jk.String()
	if o.h.loopback {
		kind += "+loopback"
	}
	if o.h.machines > 1 {
		kind += "+2 machines"
	}
	s.kinds[kind]++
	for _, v := range o.viol {
		k := classify(v)
		s.byCheck[v.check+known(k)]++
		seen := false
		for _, f := range s.failures {
			if f.check == v.check && f.known == k {
				seen = true
				break
			}
		}
		if !seen {
			s.failures = append(s.failures, failure{o: o, check: v.check, known: k, first: v})
		}
	}
}

func known(issue string) string {
	if issue == "" {
		return ""
	}
	return " (known: issue " + issue + ")"
}

func (s *stats) violations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.byCheck {
		n += c
	}
	return n
}

// explore runs histories from seeds base, base+1, ... on workers
// goroutines until d has passed.
func explore(base uint64, d time.Duration, workers int, g genConfig, e env, s *stats) {
	var next atomic.Uint64
	next.Store(base)
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				seed := next.Add(1) - 1
				s.add(runHistory(generate(seed, g), e))
			}
		}()
	}
	wg.Wait()
}

// fails reports whether running h gives a violation of check (any, if
// check is ""), trying up to tries times: goroutines interleave differently
// from run to run.
func fails(h *history, check string, tries int, e env) (bool, outcome) {
	for range tries {
		o := runHistory(h, e)
		for _, v := range o.viol {
			if check == "" || v.check == check {
				return true, o
			}
		}
	}
	return false, outcome{}
}

// shrink returns a shorter history that still breaks check: delta debugging
// over the operations (remove chunks, halving their size down to single
// steps), each candidate run up to tries times. It stops after budget.
func shrink(h *history, check string, tries int, budget time.Duration, e env) *history {
	return shrinkWith(h, func(cand *history) bool {
		ok, _ := fails(cand, check, tries, e)
		return ok
	}, budget)
}

// shrinkWith returns a shorter history for which still holds: delta
// debugging over the operations, chunks of half the history first, then
// halving their size down to single steps, until budget has passed.
func shrinkWith(h *history, still func(*history) bool, budget time.Duration) *history {
	end := time.Now().Add(budget)
	cur := h
	for chunk := len(cur.ops) / 2; chunk >= 1 && time.Now().Before(end); {
		removed := false
		for start := 0; start+chunk <= len(cur.ops) && time.Now().Before(end); {
			cand := *cur
			cand.ops = append(append([]op(nil), cur.ops[:start]...), cur.ops[start+chunk:]...)
			if still(&cand) {
				cur, removed = &cand, true
				continue
			}
			start += chunk
		}
		if !removed {
			chunk /= 2
		}
	}
	return cur
}

// reproduces counts how many of n runs of h break check.
func reproduces(h *history, check string, n int, e env) int {
	k := 0
	for range n {
		if ok, _ := fails(h, check, 1, e); ok {
			k++
		}
	}
	return k
}

// report formats a failing history for the log: its seed, how to replay
// it, its operations, its violations and its trace.
func report(o outcome, shrunk *history, check string, rate string) string {
	return reportOf(o, shrunk, check, rate, func(violation) bool { return true })
}

// reportOf is report for the violations of check that keep says.
func reportOf(o outcome, shrunk *history, check string, rate string, keep func(violation) bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== %s: seed %d (replay: IDEMRETRY_SIM_SEED=%d go test -run TestLifecycle ./sim)\n", check, o.h.seed, o.h.seed)
	fmt.Fprintf(&b, "check: %s\n", checks[check])
	fmt.Fprintf(&b, "reproduces: %s\n", rate)
	var vs []string
	for _, v := range o.viol {
		if v.check == check && keep(v) {
			vs = append(vs, v.msg)
		}
	}
	sort.Strings(vs)
	for k, v := range vs {
		if k == 5 {
			fmt.Fprintf(&b, "  ... and %d more\n", len(vs)-5)
			break
		}
		fmt.Fprintf(&b, "  violation: %s\n", v)
	}
	if shrunk != nil {
		fmt.Fprintf(&b, "shrunk to %d of %d steps (replay them alone: IDEMRETRY_SIM_SEED=%d IDEMRETRY_SIM_OPS=%s):\n%s",
			len(shrunk.ops), len(o.h.ops), o.h.seed, shrunk.steps(), shrunk)
	} else {
		fmt.Fprintf(&b, "history:\n%s", o.h)
	}
	return b.String()
}

// dump is the history's trace: every call, request, Transport event and
// journal call, in the order of their sequence numbers.
func (r *runner) dump() []string {
	type line struct {
		seq int64
		s   string
	}
	var ls []line
	r.mu.Lock()
	for _, c := range r.calls {
		i := c.intent
		ls = append(ls, line{c.startSeq, fmt.Sprintf("%s start %s (%v %s, op %d, %s, %s)", c.name, i.name, i.kind, r.actionIDOf(i), c.op, c.proc.name, cancelHow(c))})
		if j := c.joinSeq.Load(); j != 0 {
			ls = append(ls, line{j, fmt.Sprintf("%s chose its flight", c.name)})
		}
		if cs := c.cancelSeq.Load(); cs != 0 {
			ls = append(ls, line{cs, fmt.Sprintf("%s cancelled by its caller", c.name)})
		}
		if c.endSeq != 0 {
			ls = append(ls, line{c.endSeq, fmt.Sprintf("%s end: status %d err %v giveUp %v replay %v answer %+v unchecked %v", c.name, c.status, c.err, c.giveUp, c.replay, c.answer, c.unchecked)})
		}
	}
	r.mu.Unlock()
	r.rec.mu.Lock()
	for _, ev := range r.rec.net {
		ls = append(ls, line{ev.seq, fmt.Sprintf("net %s attempt %d key %s fault %v (%s) -> %s %s status %d", callName(ev.call), ev.attempt, ev.key, ev.fault, ev.proc.name, ev.outcome, ev.charge, ev.status)})
		if ev.endSeq != 0 {
			ls = append(ls, line{ev.endSeq, fmt.Sprintf("net %s attempt %d returned", callName(ev.call), ev.attempt)})
		}
	}
	for _, e := range r.rec.events {
		ls = append(ls, line{e.seq, fmt.Sprintf("event %s %v action %s key %s attempt %d status %d err %v reason %v wait %v", e.proc.name, e.ev.Kind, e.ev.Action, e.ev.Key, e.ev.Attempt, e.ev.Status, e.ev.Err, e.ev.Reason, e.ev.Wait)})
	}
	for _, rv := range r.rec.reserves {
		ls = append(ls, line{rv.seq, fmt.Sprintf("journal %s reserve by %s: %s key %s created %v at %v err %v", rv.proc.name, callName(rv.call), rv.actionID, rv.key, rv.created, rv.createdAt.Format("15:04:05.000"), rv.err)})
	}
	for _, w := range r.rec.writes {
		what := fmt.Sprintf("update %s key %s %v status %d", w.rec.ActionID, w.rec.Key, w.rec.State, w.rec.Status)
		if w.sync {
			what = "sync"
		}
		ls = append(ls, line{w.seq, fmt.Sprintf("journal %s %s by %s: err %v injected %v ended %v (deadline in %v)", w.proc.name, what, callName(w.call), w.err, w.injected, w.ctxEndedAtEntry, w.left)})
	}
	for _, rs := range r.rec.resolves {
		ls = append(ls, line{rs.seq, fmt.Sprintf("resolve %s key %s charged %v", rs.rec.ActionID, rs.rec.Key, rs.charged)})
	}
	lines := append([]string(nil), r.rec.lines...)
	r.rec.mu.Unlock()
	sort.SliceStable(ls, func(a, b int) bool { return ls[a].seq < ls[b].seq })
	out := make([]string, 0, len(ls)+len(lines))
	out = append(out, lines...)
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%6d %s", l.seq, l.s))
	}
	return out
}
