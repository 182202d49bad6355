package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// opKind is what one step of a history does.
type opKind uint8

const (
	opPay          opKind = iota // a new intent: one caller, a double tap or N callers
	opAgain                      // an unfinished intent again (a tap or a retry), or a finished named one (a resend)
	opRepeat                     // a deliberate repeat of a finished intent: a new intent with its body
	opResume                     // Transport.Resume, its Rebuilds perhaps paused
	opRelease                    // paused Rebuilds go on
	opAwait                      // wait for every call in the air
	opCrash                      // the process dies: its Transport dropped without Close, the journal reopened from disk
	opRestart                    // Close, then a new Transport with the options set since
	opAdvance                    // true time passes
	opJump                       // the wall clock is set: its error becomes d
	opOptions                    // an option changes for the next start
	opJournalFault               // the journal layer fails the next calls
	opMachine                    // the other machine (two Transports on one PostgreSQL table) takes the next steps
	nOps
)

var opNames = [...]string{"pay", "again", "repeat", "resume", "release", "await", "crash", "restart", "advance", "jump",
	"options", "journal-fault", "machine"}

// cancelKind is how a caller may give up.
type cancelKind uint8

const (
	cancelNone     cancelKind = iota
	cancelDeadline            // context.WithTimeout(d)
	cancelCancel              // a cancel d after the call starts
	cancelRequest             // Request.Cancel closed d after the call starts
	cancelFar                 // context.WithTimeout(math.MaxInt64): a deadline 292 years ahead
	nCancels
)

var cancelNames = [...]string{"none", "deadline", "cancel", "Request.Cancel", "far-deadline"}

// optField is an option that opOptions changes.
type optField uint8

const (
	optMaxRetries optField = iota
	optBudget
	optDupWindow
	optQuoted
	optKeyWindow
	optSettle
	optMaxShared
	optMaxBuffered
	optMaxRetryAfter
	optJournalTimeout
	nOptFields
)

var optNames = [...]string{"max-retries", "budget", "duplicate-window", "quoted-keys", "key-window", "settle",
	"max-shared", "max-buffered", "max-retry-after", "journal-timeout"}

// the values each option takes.
var (
	maxRetriesValues     = []int{5, 0, 1, 3}
	budgetValues         = []string{"default", "off", "tiny"}
	dupWindowValues      = []time.Duration{0, 30 * time.Second, 90 * time.Second}
	keyWindowValues      = []time.Duration{24 * time.Hour, 2 * time.Hour, 10 * time.Minute}
	settleValues         = []time.Duration{time.Minute, 0, 10 * time.Minute, math.MaxInt64}
	maxSharedValues      = []int64{0, 16, math.MaxInt64} // 0: the default
	maxBufferedValues    = []int64{0, math.MaxInt64}
	maxRetryAfterValues  = []time.Duration{30 * time.Second, 0, 2 * time.Second, math.MaxInt64}
	journalTimeoutValues = []time.Duration{5 * time.Second, 50 * time.Millisecond}
	cancelDurations      = []time.Duration{time.Millisecond, 5 * time.Millisecond, 25 * time.Millisecond, 150 * time.Millisecond, 2 * time.Second}
	advanceDurations     = []time.Duration{100 * time.Millisecond, 3 * time.Second, 35 * time.Second, 70 * time.Second, 5 * time.Minute,
		2*time.Hour + time.Minute, 25 * time.Hour, 49 * time.Hour}
	jumpOffsets = []time.Duration{0, -20 * time.Minute, -5 * time.Minute, -90 * time.Second, 30 * time.Second, 5 * time.Minute, 20 * time.Minute}
)

type op struct {
	idx     int // its place in the history as generated (shrinking removes steps)
	kind    opKind
	ik      intentKind
	body    int
	callers int
	cancel  cancelKind
	cancelD time.Duration
	async   bool
	sel     int
	read    readMode
	getBody bool
	sdk     bool          // a named pay whose calls each carry an SDK's new key
	pause   bool          // opResume
	d       time.Duration // opAdvance, opJump
	field   optField      // opOptions
	value   int           // opOptions: index into the field's values
	jf      jfault        // opJournalFault
	n       int           // opJournalFault
}

func (o op) String() string {
	var b strings.Builder
	b.WriteString(opNames[o.kind])
	switch o.kind {
	case opPay, opAgain, opRepeat:
		if o.kind == opPay {
			fmt.Fprintf(&b, " %v body=%d", o.ik, o.body)
			if o.sdk && o.ik == named {
				b.WriteString(" sdk-keys")
			}
		} else {
			fmt.Fprintf(&b, " #%d", o.sel)
		}
		if o.callers > 1 {
			fmt.Fprintf(&b, " callers=%d", o.callers)
		}
		if o.cancel != cancelNone {
			fmt.Fprintf(&b, " %s", cancelNames[o.cancel])
			if o.cancel != cancelFar {
				fmt.Fprintf(&b, "(%v)", o.cancelD)
			}
		}
		if o.async {
			b.WriteString(" async")
		}
		if o.read != readAll {
			b.WriteString([]string{"", " no-close", " unread"}[o.read])
		}
		if o.getBody {
			b.WriteString(" getbody")
		}
	case opResume:
		if o.pause {
			b.WriteString(" pause")
		}
		if o.async {
			b.WriteString(" async")
		}
	case opAdvance:
		fmt.Fprintf(&b, " %v", o.d)
	case opJump:
		fmt.Fprintf(&b, " offset=%v", o.d)
	case opOptions:
		fmt.Fprintf(&b, " %s=%s", optNames[o.field], optValueString(o.field, o.value))
	case opJournalFault:
		fmt.Fprintf(&b, " %v x%d", o.jf, o.n)
	}
	return b.String()
}

func optValueString(f optField, v int) string {
	switch f {
	case optMaxRetries:
		return fmt.Sprint(maxRetriesValues[v%len(maxRetriesValues)])
	case optBudget:
		return budgetValues[v%len(budgetValues)]
	case optDupWindow:
		return fmt.Sprint(dupWindowValues[v%len(dupWindowValues)])
	case optQuoted:
		return fmt.Sprint(v%2 == 1)
	case optKeyWindow:
		return fmt.Sprint(keyWindowValues[v%len(keyWindowValues)])
	case optSettle:
		return durString(settleValues[v%len(settleValues)])
	case optMaxShared:
		return sizeString(maxSharedValues[v%len(maxSharedValues)])
	case optMaxBuffered:
		return sizeString(maxBufferedValues[v%len(maxBufferedValues)])
	case optMaxRetryAfter:
		return durString(maxRetryAfterValues[v%len(maxRetryAfterValues)])
	case optJournalTimeout:
		return fmt.Sprint(journalTimeoutValues[v%len(journalTimeoutValues)])
	}
	return "?"
}

func durString(d time.Duration) string {
	if d == math.MaxInt64 {
		return "MaxInt64"
	}
	return d.String()
}

func sizeString(n int64) string {
	switch n {
	case 0:
		return "default"
	case math.MaxInt64:
		return "MaxInt64"
	}
	return fmt.Sprint(n)
}

// history is one generated run: its configuration and its operations, all
// drawn from its seed.
type history struct {
	seed     uint64
	jk       journalKind
	loopback bool
	machines int
	faults   *faultPlan
	opts     topts
	ops      []op
}

func (h *history) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %v journal, %s network, %d machine(s), options %v, faults %v\n", h.seed, h.jk,
		map[bool]string{false: "in-memory", true: "loopback"}[h.loopback], h.machines, h.opts, h.faults)
	for _, o := range h.ops {
		fmt.Fprintf(&b, "  %2d %v\n", o.idx, o)
	}
	return b.String()
}

// steps lists the generated steps h keeps, for IDEMRETRY_SIM_OPS.
func (h *history) steps() string {
	var s []string
	for _, o := range h.ops {
		s = append(s, fmt.Sprint(o.idx))
	}
	return strings.Join(s, ",")
}

// keep returns h with only the generated steps listed (comma-separated
// indexes, as steps gives them).
func (h *history) keep(list string) (*history, error) {
	want := map[int]bool{}
	for _, f := range strings.Split(list, ",") {
		var i int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &i); err != nil {
			return nil, fmt.Errorf("step %q: %w", f, err)
		}
		want[i] = true
	}
	k := *h
	k.ops = nil
	for _, o := range h.ops {
		if want[o.idx] {
			k.ops = append(k.ops, o)
		}
	}
	return &k, nil
}

func (p *faultPlan) String() string {
	var parts []string
	for i, w := range p.weights {
		if w > 0 && faultKind(i) != fNone {
			parts = append(parts, fmt.Sprintf("%v:%d", faultKind(i), w))
		}
	}
	return fmt.Sprintf("[none:%d %s]", p.weights[fNone], strings.Join(parts, " "))
}

// genConfig says which kinds of history may be drawn.
type genConfig struct {
	sql      bool // a PostgreSQL is there
	loopback int  // percent of histories over loopback
	file     int  // percent on the file journal
	sqlShare int  // percent on PostgreSQL, when there is one
	maxOps   int
}

// generate draws a history from seed. Each history enables a random subset
// of the operations and faults with random weights (swarm testing: a
// history that never crashes explores more deadlines, one without faults
// more flights), so that features meet in many proportions.
func generate(seed uint64, g genConfig) *history {
	r := rand.New(rand.NewPCG(seed, seed>>32^0x5851f42d4c957f2d))
	h := &history{seed: seed, machines: 1}
	switch x := r.IntN(100); {
	case g.sql && x < g.sqlShare:
		h.jk = sqlJournal
		h.machines = 1 + r.IntN(2)
	case x < g.sqlShare+g.file:
		h.jk = fileJournal
	default:
		h.jk = memJournal
	}
	h.loopback = r.IntN(100) < g.loopback
	h.faults = &faultPlan{seed: seed}
	calm := r.IntN(4) == 0
	for k := range nFaults {
		w := 0
		if k == fNone {
			w = 40 + r.IntN(60)
		} else if !calm && r.IntN(3) > 0 {
			w = r.IntN(12)
		}
		switch k {
		case fUpgrade, fHugeRA:
			w /= 4
		}
		h.faults.weights[k] = w
		h.faults.total += w
	}
	h.opts = defaultOpts(h.jk)
	if r.IntN(3) == 0 {
		h.opts.dupWindow = dupWindowValues[1+r.IntN(2)]
	}
	if r.IntN(4) == 0 {
		h.opts.maxRetries = maxRetriesValues[r.IntN(len(maxRetriesValues))]
	}
	// Options at the first start drawn from a stream of their own, so that
	// a seed draws the same operations and faults as before they were.
	or := rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15, seed))
	if or.IntN(8) == 0 {
		// A short key window and a settle time of "no limit": an action
		// outcome-unknown within the history that Resume must never hand
		// to Resolve (the sum saturates).
		h.opts.keyWindow = keyWindowValues[2]
		h.opts.settle = settleValues[3]
	}
	var weights [nOps]int
	base := [nOps]int{opPay: 30, opAgain: 20, opRepeat: 12, opResume: 8, opRelease: 4, opAwait: 6, opCrash: 4, opRestart: 3,
		opAdvance: 8, opJump: 3, opOptions: 4, opJournalFault: 4, opMachine: 0}
	if h.machines == 2 {
		base[opMachine] = 8
	}
	for k, w := range base {
		if w > 0 && (opKind(k) <= opRepeat || r.IntN(5) > 0) {
			weights[k] = 1 + r.IntN(2*w)
		}
	}
	if h.jk == sqlJournal {
		weights[opJump] = 0 // the database's clock does not jump with ours
	}
	total := 0
	for _, w := range weights {
		total += w
	}
	nops := 4 + r.IntN(g.maxOps-3)
	for range nops {
		x := r.IntN(total)
		k := opPay
		for i, w := range weights {
			if x < w {
				k = opKind(i)
				break
			}
			x -= w
		}
		o := drawOp(r, k)
		o.idx = len(h.ops)
		h.ops = append(h.ops, o)
	}
	return h
}

func drawOp(r *rand.Rand, k opKind) op {
	o := op{kind: k, callers: 1}
	switch k {
	case opPay, opAgain, opRepeat:
		o.ik = intentKind(r.IntN(3))
		o.body = r.IntN(len(bodies))
		if r.IntN(3) == 0 {
			o.callers = 2 + r.IntN(3)
		}
		if r.IntN(3) == 0 {
			o.cancel = cancelKind(1 + r.IntN(int(nCancels)-1))
			o.cancelD = cancelDurations[r.IntN(len(cancelDurations))]
		}
		o.async = r.IntN(4) == 0
		o.sel = r.IntN(1000)
		switch x := r.IntN(10); {
		case x == 0:
			o.read = readNoClose
		case x == 1:
			o.read = readNone
		}
		o.getBody = r.IntN(2) == 0
		o.sdk = r.IntN(3) == 0
	case opResume:
		o.pause = r.IntN(2) == 0
		o.async = o.pause || r.IntN(2) == 0
	case opAdvance:
		o.d = advanceDurations[r.IntN(len(advanceDurations))]
	case opJump:
		o.d = jumpOffsets[r.IntN(len(jumpOffsets))]
	case opOptions:
		o.field = optField(r.IntN(int(nOptFields)))
		o.value = r.IntN(12)
	case opJournalFault:
		o.jf = jfault(r.IntN(int(nJFaults)))
		o.n = []int{1, 2, 5}[r.IntN(3)]
	}
	return o
}

// topts are a Transport's options in a history.
type topts struct {
	maxRetries     int
	budget         string
	dupWindow      time.Duration
	quoted         bool
	keyWindow      time.Duration
	settle         time.Duration
	maxShared      int64
	maxBuffered    int64
	maxRetryAfter  time.Duration
	journalTimeout time.Duration
}

func (o topts) String() string {
	return fmt.Sprintf("{retries %d, budget %s, dup %v, quoted %v, window %v, settle %s, shared %s, buffered %s, max-RA %s, jtimeout %v}",
		o.maxRetries, o.budget, o.dupWindow, o.quoted, o.keyWindow, durString(o.settle), sizeString(o.maxShared),
		sizeString(o.maxBuffered), durString(o.maxRetryAfter), o.journalTimeout)
}

func defaultOpts(jk journalKind) topts {
	return topts{maxRetries: 5, budget: "default", keyWindow: 24 * time.Hour, settle: time.Minute, maxRetryAfter: 30 * time.Second,
		journalTimeout: 5 * time.Second}
}

func (o *topts) apply(f optField, v int) {
	switch f {
	case optMaxRetries:
		o.maxRetries = maxRetriesValues[v%len(maxRetriesValues)]
	case optBudget:
		o.budget = budgetValues[v%len(budgetValues)]
	case optDupWindow:
		o.dupWindow = dupWindowValues[v%len(dupWindowValues)]
	case optQuoted:
		o.quoted = v%2 == 1
	case optKeyWindow:
		o.keyWindow = keyWindowValues[v%len(keyWindowValues)]
	case optSettle:
		o.settle = settleValues[v%len(settleValues)]
	case optMaxShared:
		o.maxShared = maxSharedValues[v%len(maxSharedValues)]
	case optMaxBuffered:
		o.maxBuffered = maxBufferedValues[v%len(maxBufferedValues)]
	case optMaxRetryAfter:
		o.maxRetryAfter = maxRetryAfterValues[v%len(maxRetryAfterValues)]
	case optJournalTimeout:
		o.journalTimeout = journalTimeoutValues[v%len(journalTimeoutValues)]
	}
	if o.dupWindow >= o.keyWindow {
		o.dupWindow = 0
	}
}
