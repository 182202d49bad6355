package sim

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// serverWindow is the payment server's key retention. Every key window the
// Transport is given is at most 24 hours, and the wall clock's error at most
// 20 minutes either way, so the hour between them covers the clock error
// the README tells an app to allow for (guarantee 5).
const serverWindow = 25 * time.Hour

// leaseTTL is the lease TTL on PostgreSQL: short, so that a machine that
// died holding a lease delays the other by little real time.
const leaseTTL = 300 * time.Millisecond

// env is what a history may use beyond memory: a directory for file
// journals, a PostgreSQL.
type env struct {
	dir string
	db  *sql.DB
}

type process struct {
	n       int // generation: 0, then +1 at each restart or crash
	machine int
	name    string
	tr      *idemretry.Transport
	fj      *faultJournal
	j       journal.Journal // the real journal
	dead    atomic.Bool
	diedSeq atomic.Int64
	ctx     context.Context
	cancel  context.CancelFunc
	opts    topts
	calls   group
}

type runner struct {
	h   *history
	clk *vclock
	rec *recorder
	net *network
	st  *store

	mu        sync.Mutex
	intents   []*intent
	calls     []*call
	byName    map[string]*call
	procs     [2]*process
	all       []*process
	target    int
	pending   [2]topts
	release   chan struct{}
	nAction   int
	opIndex   int
	maxOffset time.Duration
	// looseAdvance is the longest advance made while calls were in the
	// air: one may have checked its window just before it.
	looseAdvance time.Duration
	heldOpen     []io.ReadCloser
	// heldCancels end the contexts of the calls whose bodies are held
	// open, at the history's end.
	heldCancels []context.CancelFunc
	mintOf      sync.Map    // key -> *call that minted it
	forgotAt    sync.Map    // key -> seq of the Resolve that let it be forgotten
	skipped     int         // ops that found nothing to act on
	damaged     atomic.Bool // the journal layer handed out a damaged record
	// withinWindow: the next calls repeat an unnamed payment within the
	// duplicate window: the same action, answered with its replay.
	withinWindow bool
	damagedID    sync.Map // action ids it damaged

	async group
	viol  []violation
}

func newRunner(h *history, e env) (*runner, error) {
	r := &runner{h: h, clk: &vclock{}, rec: &recorder{}, byName: make(map[string]*call), release: make(chan struct{})}
	r.st = &store{kind: h.jk, clk: r.clk}
	switch h.jk {
	case fileJournal:
		root, err := os.MkdirTemp(e.dir, "hist")
		if err != nil {
			return nil, err
		}
		r.st.root = root
	case sqlJournal:
		r.clk.base = time.Now().UTC().Truncate(time.Millisecond)
		r.st.db = e.db
		r.st.table = fmt.Sprintf("sim_%d_%s", h.seed%1000000, hex.EncodeToString(randBytes(4)))
	}
	r.net = newNetwork(r, h.loopback)
	r.pending[0], r.pending[1] = h.opts, h.opts
	return r, nil
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

func (r *runner) callNamed(name string) *call {
	if name == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byName[name]
}

func (r *runner) violate(check, format string, args ...any) {
	r.violateTags(check, nil, format, args...)
}

// violateTags records a violation with tags: what in the history caused it,
// where that can be told (an option's value, a fault), for knownBugs.
func (r *runner) violateTags(check string, tags []string, format string, args ...any) {
	v := violation{check: check, msg: fmt.Sprintf(format, args...), tags: tags}
	r.damagedID.Range(func(id, _ any) bool {
		if strings.Contains(v.msg, id.(string)) {
			v.tags = append(v.tags, "damaged-record")
			return false
		}
		return true
	})
	tags = v.tags
	if len(tags) > 0 {
		v.msg += " [" + strings.Join(tags, ", ") + "]"
	}
	r.mu.Lock()
	r.viol = append(r.viol, v)
	r.mu.Unlock()
}

// startProcess starts machine m's next process with its pending options.
func (r *runner) startProcess(m int) error {
	opts := r.pending[m]
	j, err := r.st.open(opts.keyWindow)
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	gen := 0
	if old := r.procs[m]; old != nil {
		gen = old.n + 1
	}
	p := &process{n: gen, machine: m, name: fmt.Sprintf("m%d.%d", m, gen), j: j, opts: opts}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	fj, wj := wrap(r.h.jk, j, p, r)
	p.fj = fj
	o := []idemretry.Option{
		idemretry.WithJournal(wj), idemretry.WithClock(r.clk),
		idemretry.WithObserver(func(ev idemretry.Event) { r.observe(p, ev) }),
		idemretry.WithMaxRetries(opts.maxRetries), idemretry.WithKeyWindow(opts.keyWindow),
		idemretry.WithSettleTime(opts.settle), idemretry.WithMaxRetryAfter(opts.maxRetryAfter),
		idemretry.WithJournalTimeout(opts.journalTimeout),
	}
	switch opts.budget {
	case "off":
		o = append(o, idemretry.WithRetryBudget(0, 0))
	case "tiny":
		o = append(o, idemretry.WithRetryBudget(1, 0.1))
	}
	if opts.dupWindow > 0 {
		o = append(o, idemretry.WithDuplicateWindow(opts.dupWindow))
	}
	if opts.quoted {
		o = append(o, idemretry.WithQuotedKey())
	}
	if opts.maxShared != 0 {
		o = append(o, idemretry.WithMaxSharedResponse(opts.maxShared))
	}
	if opts.maxBuffered != 0 {
		o = append(o, idemretry.WithMaxBufferedBody(opts.maxBuffered))
	}
	if r.h.jk == sqlJournal {
		o = append(o, idemretry.WithLeaseTTL(leaseTTL))
	}
	tr, err := idemretry.NewTransport(&base{n: r.net, p: p}, o...)
	if err != nil {
		r.closeJournal(j)
		return fmt.Errorf("new Transport: %w", err)
	}
	p.tr = tr
	r.mu.Lock()
	r.procs[m] = p
	r.all = append(r.all, p)
	r.mu.Unlock()
	r.rec.logf("start %s %v", p.name, opts)
	return nil
}

func (r *runner) closeJournal(j journal.Journal) {
	if r.h.jk != memJournal {
		j.Close()
	}
}

func (r *runner) observe(p *process, ev idemretry.Event) {
	r.rec.mu.Lock()
	r.rec.events = append(r.rec.events, transportEvent{seq: r.rec.next(), proc: p, ev: ev, realAt: time.Now()})
	r.rec.mu.Unlock()
}

// run executes the history and returns its violations.
func (r *runner) run() (err error) {
	if err := r.startProcess(0); err != nil {
		return err
	}
	for i, o := range r.h.ops {
		r.mu.Lock()
		r.opIndex = i
		r.mu.Unlock()
		r.rec.logf("op %d: %v", i, o)
		if err := r.exec(o); err != nil {
			return fmt.Errorf("op %d (%v): %w", i, o, err)
		}
	}
	r.finish()
	r.check()
	return nil
}

func (r *runner) exec(o op) error {
	p := r.procs[r.target]
	switch o.kind {
	case opPay:
		i := r.newIntent(o.ik, o.body, nil)
		if i != nil && i.kind == named && o.sdk && len(i.calls) == 0 {
			i.sdk = true
		}
		r.startCalls(i, o)
	case opAgain:
		i := r.pickAgain(o.sel)
		if i == nil || !r.stillItsOwn(i) {
			r.skipped++
			return nil
		}
		r.startCalls(i, o)
	case opRepeat:
		f := r.pickFinished(o.sel)
		if f == nil {
			r.skipped++
			return nil
		}
		i := r.newIntent(f.kind, f.body, f)
		r.startCalls(i, o)
	case opResume:
		r.resume(p, o)
	case opRelease:
		r.mu.Lock()
		close(r.release)
		r.release = make(chan struct{})
		r.mu.Unlock()
	case opAwait:
		r.awaitAll(20 * time.Second)
	case opCrash:
		return r.crash(p)
	case opRestart:
		return r.restart(p)
	case opAdvance:
		if o.d >= time.Minute {
			// Minutes passing let every call in the air end first: a call
			// checks its key window and then sends, and no clock jumps a
			// window between the two.
			r.awaitAll(20 * time.Second)
			r.waitIdle(2 * time.Second)
		} else {
			r.mu.Lock()
			r.looseAdvance = max(r.looseAdvance, o.d)
			r.mu.Unlock()
		}
		r.clk.Advance(o.d)
	case opJump:
		r.clk.SetOffset(o.d)
		r.mu.Lock()
		r.maxOffset = max(r.maxOffset, o.d, -o.d)
		r.mu.Unlock()
	case opOptions:
		r.pending[r.target].apply(o.field, o.value)
	case opJournalFault:
		if o.jf == jfFailSync && r.h.jk != fileJournal {
			r.skipped++
			return nil
		}
		p.fj.arm(o.jf, o.n)
	case opMachine:
		if r.h.machines < 2 {
			r.skipped++
			return nil
		}
		r.target ^= 1
		if r.procs[r.target] == nil {
			return r.startProcess(r.target)
		}
	}
	return nil
}

// newIntent makes a new intent, or, for an unnamed one, finds the intent
// the Transport must take it for (see resolveUnnamed): nil to skip.
func (r *runner) newIntent(k intentKind, body int, of *intent) *intent {
	if k == unnamed {
		if i, ok := r.resolveUnnamed(body); ok {
			return i
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i := &intent{n: len(r.intents) + 1, kind: k, body: body, repeatOf: of, forgottenKeys: map[string]bool{}}
	if of != nil {
		i.sdk = of.sdk // the same app code makes the repeat
	}
	i.name = fmt.Sprintf("i%d", i.n)
	switch k {
	case named:
		r.nAction++
		i.action = fmt.Sprintf("pay:order-%d", r.nAction)
	case keyed:
		i.key = fmt.Sprintf("app-%016x-%d", r.h.seed, i.n)
	}
	r.intents = append(r.intents, i)
	return i
}

// newRepeatIntent returns a new unnamed intent, a deliberate repeat of i
// (finished, on a process without a duplicate window), or nil while
// another unnamed intent with i's body is unfinished (the repeat would be
// a tap of it: resolveUnnamed's first case). Unlike newIntent it waits for
// nothing: it is called from a Rebuild, inside a Resume that awaitAll
// would wait for.
func (r *runner) newRepeatIntent(of *intent) *intent {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range r.intents {
		if j.kind == unnamed && j.body == of.body && !j.finished {
			return nil
		}
	}
	i := &intent{n: len(r.intents) + 1, kind: unnamed, body: of.body, repeatOf: of, forgottenKeys: map[string]bool{}, sdk: of.sdk}
	i.name = fmt.Sprintf("i%d", i.n)
	r.intents = append(r.intents, i)
	return i
}

// resolveUnnamed decides what a new unnamed payment of body is, as the
// README says the Transport takes it: while an unfinished unnamed intent
// has the body, the same intent (an identical request while the first is
// in flight or pending joins it); within the duplicate window of the last
// action with the body, that action again (a replay); else a new intent
// (ok false). It waits for the calls in the air first, so that no retry
// wait moves the clock between this judgement and the Transport's.
func (r *runner) resolveUnnamed(body int) (*intent, bool) {
	r.mu.Lock()
	limit := r.procs[r.target].opts.keyWindow + 12*time.Hour
	for _, i := range r.intents {
		if i.kind == unnamed && i.body == body && !i.finished {
			stale := i.minted && r.clk.trueSince()-i.mintedAt >= limit
			r.mu.Unlock()
			if stale {
				// As pickAgain: its record may have expired, and then it
				// is a new key's, or not: an app does not pay again a
				// payment it left unfinished two days ago.
				r.skipped++
				return &intent{}, true
			}
			if !r.stillItsOwn(i) {
				r.skipped++
				return &intent{}, true // the duplicate window makes it another's tap
			}
			return i, true
		}
	}
	r.mu.Unlock()
	p := r.procs[r.target]
	d := p.opts.dupWindow
	if d <= 0 {
		return nil, false
	}
	r.awaitAll(20 * time.Second)
	rec, found, err := p.j.(journal.Getter).Get(context.Background(), fingerprintID(r.net.url(), bodies[body]))
	if err != nil || !found {
		return nil, false
	}
	earlier := r.earlierNow(p)
	edge := rec.CreatedAt.Add(d)
	r.rec.logf("unnamed body %d: the last action with it is %s (key %s, %v, created %v); now %v, the duplicate window %v ends %v",
		body, rec.ActionID, rec.Key, rec.State, rec.CreatedAt.Format("15:04:05.000"), earlier.Format("15:04:05.000"), d, edge.Format("15:04:05.000"))
	switch {
	case earlier.Before(edge.Add(-2 * time.Second)):
		if c, ok := r.mintOf.Load(rec.Key); ok {
			r.withinWindow = true // the next calls must get the replay
			return c.(*call).intent, true
		}
		r.skipped++
		return &intent{}, true // an action of no intent's: skipped
	case earlier.Before(edge.Add(2 * time.Second)):
		r.skipped++
		return &intent{}, true // too near the window's end to tell: skipped
	}
	return nil, false
}

// stillItsOwn reports whether sending unnamed intent i again is i's own
// action: false when i has no key of its own yet and the duplicate window
// (turned on since it was made) would take it for a tap of the last action
// with its body, another intent's.
func (r *runner) stillItsOwn(i *intent) bool {
	r.mu.Lock()
	minted := i.minted
	r.mu.Unlock()
	p := r.procs[r.target]
	if i.kind != unnamed || minted || p.opts.dupWindow <= 0 {
		return true
	}
	r.awaitAll(20 * time.Second)
	rec, found, err := p.j.(journal.Getter).Get(context.Background(), fingerprintID(r.net.url(), i.bodyBytes()))
	if err != nil || !found {
		return true
	}
	if c, ok := r.mintOf.Load(rec.Key); ok && c.(*call).intent == i {
		return true
	}
	return !r.earlierNow(p).Before(rec.CreatedAt.Add(p.opts.dupWindow + 2*time.Second))
}

// earlierNow is the earlier of the clock and the journal's time, as the
// Transport judges the duplicate window and the settle time.
func (r *runner) earlierNow(p *process) time.Time {
	now := r.clk.Now()
	if tk, ok := p.j.(journal.Timekeeper); ok {
		if jn := tk.Now(); jn.Before(now) {
			return jn
		}
	}
	return now
}

// pickAgain picks an intent to send again: an unfinished one (a tap, a
// retry), or a finished named or keyed one (a resend, answered with the
// replay).
func (r *runner) pickAgain(sel int) *intent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var cands []*intent
	limit := r.procs[r.target].opts.keyWindow + 12*time.Hour
	for _, i := range r.intents {
		if i.minted && r.clk.trueSince()-i.mintedAt >= limit {
			// Not once its done record may have expired (the journal's
			// retention: the window and a day's grace), when a new key is
			// right: an app does not send a two-day-old payment again.
			// Until then a resend is answered with the replay, or refused
			// once its key window ended.
			continue
		}
		if !i.reconciled && (!i.finished || i.kind != unnamed) {
			cands = append(cands, i)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[sel%len(cands)]
}

func (r *runner) pickFinished(sel int) *intent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var cands []*intent
	for _, i := range r.intents {
		if i.finished {
			cands = append(cands, i)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[sel%len(cands)]
}

func (r *runner) newCall(i *intent, p *process, k callKind) *call {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &call{n: len(r.calls) + 1, intent: i, proc: p, kind: k, op: r.opIndex, joined: make(chan struct{})}
	c.name = fmt.Sprintf("c%d", c.n)
	r.calls = append(r.calls, c)
	r.byName[c.name] = c
	i.calls = append(i.calls, c)
	return c
}

// startCalls sends intent i with op o's callers, at once.
func (r *runner) startCalls(i *intent, o op) {
	if i == nil || i.name == "" {
		r.withinWindow = false
		return // skipped
	}
	p := r.procs[r.target]
	var g *tapGroup
	if o.callers > 1 {
		g = &tapGroup{}
	}
	within := r.withinWindow
	r.withinWindow = false
	cs := make([]*call, o.callers)
	for k := range cs {
		cs[k] = r.newCall(i, p, callPay)
		cs[k].withinWindow = within
		cs[k].group = g
		cs[k].readMode = o.read
		cs[k].getBody = o.getBody
		if g != nil {
			g.calls = append(g.calls, cs[k])
		}
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		r.async.Add(1)
		p.calls.Add(1)
		go func() {
			defer wg.Done()
			defer r.async.Done()
			defer p.calls.Done()
			r.doCall(c, o)
		}()
	}
	if !o.async {
		wg.Wait()
		return
	}
	// In the air before the next step: each call has chosen its flight
	// (or ended), so that a step after this one comes after these taps.
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for _, c := range cs {
		select {
		case <-c.joined:
		case <-t.C:
			return
		}
	}
}

func (r *runner) cancelCall(c *call) {
	if c.cancelFn != nil {
		c.cancelFn()
	}
}

// doCall makes one call and learns what it was told.
func (r *runner) doCall(c *call, o op) {
	i, p := c.intent, c.proc
	ctx := context.WithValue(p.ctx, callCtxKey{}, c)
	if i.kind == named {
		ctx = idemretry.WithAction(ctx, i.action)
	}
	var cancel context.CancelFunc
	var timer *time.Timer
	switch o.cancel {
	case cancelDeadline:
		ctx, cancel = context.WithTimeout(ctx, o.cancelD)
	case cancelFar:
		ctx, cancel = context.WithTimeout(ctx, math.MaxInt64)
	default:
		ctx, cancel = context.WithCancel(ctx)
	}
	if o.cancel == cancelRequest {
		c.reqCancel = make(chan struct{})
	}
	var once sync.Once
	c.cancelFn = func() {
		once.Do(func() {
			// Cancelled first, logged after: every request logged after
			// this was made after the cancel.
			c.cancelAt.Store(time.Now().UnixNano())
			if c.reqCancel != nil {
				close(c.reqCancel)
			} else {
				cancel()
			}
			c.cancelSeq.Store(r.rec.next())
		})
	}
	if o.cancel == cancelCancel || o.cancel == cancelRequest {
		timer = time.AfterFunc(o.cancelD, c.cancelFn)
	}
	pctx := &probeCtx{Context: ctx, c: c, rec: r.rec}
	req, body := requestFor(pctx, r.net.url(), i, c, o.getBody)
	if c.reqCancel != nil {
		//lint:ignore SA1019 the deprecated Request.Cancel is one of the ways a caller gives up, and net/http still honours it
		req.Cancel = c.reqCancel
	}
	if dl, ok := ctx.Deadline(); ok && o.cancel == cancelDeadline {
		c.deadline = dl
	}
	c.far = o.cancel == cancelFar
	c.startSeq, c.start = r.rec.next(), time.Now()
	resp, err := p.tr.RoundTrip(req)
	c.outcome, c.hasOutcome = idemretry.OutcomeOf(resp, err), true
	r.read(c, resp, err)
	c.markJoined(0)
	if timer != nil {
		timer.Stop()
	}
	if c.heldOpen {
		// An app that keeps the body open keeps the context too (a
		// request's context lives on in its app): cancelled at the end.
		r.mu.Lock()
		r.heldCancels = append(r.heldCancels, cancel)
		r.mu.Unlock()
	} else {
		cancel()
	}
	if !body.closed.Load() {
		r.violate("request-body-closed", "%s: RoundTrip returned without closing the request body (http.RoundTripper's contract)", c.name)
	}
	r.learn(c)
}

// read takes what RoundTrip returned, reading the body as the call's app
// does.
func (r *runner) read(c *call, resp *http.Response, err error) {
	var res callResult
	res.err = err
	if resp != nil {
		if err != nil {
			r.violate("response-or-error", "%s: RoundTrip returned both a response (%d) and an error (%v)", c.name, resp.StatusCode, err)
		}
		res.status, res.giveUp, res.replay = resp.StatusCode, idemretry.GiveUpReason(resp), idemretry.IsReplay(resp)
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols || c.readMode == readNone:
			resp.Body.Close()
		default:
			res.body, res.readErr = io.ReadAll(resp.Body)
			if c.readMode == readNoClose && res.readErr == nil {
				res.heldOpen = true
				r.mu.Lock()
				r.heldOpen = append(r.heldOpen, resp.Body)
				r.mu.Unlock()
			} else {
				resp.Body.Close()
			}
			res.answer, _ = paytestAnswer(res.body)
		}
	}
	r.mu.Lock()
	c.err, c.status, c.giveUp, c.replay = res.err, res.status, res.giveUp, res.replay
	c.respBody, c.readErr, c.heldOpen, c.answer = res.body, res.readErr, res.heldOpen, res.answer
	c.endSeq, c.end = r.rec.next(), time.Now()
	r.mu.Unlock()
}

// callResult is what a call was told, set on the call under the runner's
// lock.
type callResult struct {
	status   int
	err      error
	giveUp   error
	replay   bool
	body     []byte
	readErr  error
	heldOpen bool
	answer   answerSeen
}

// learn updates the model with what call c was told.
func (r *runner) learn(c *call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.proc.dead.Load() {
		c.unchecked = true // its process died: the app never learnt it
		return
	}
	i := c.intent
	if st, ok := c.final(); ok && !i.finished {
		i.finished, i.status, i.finishedSeq = true, st, c.endSeq
		if st >= 200 && st < 300 {
			i.paid = true
			i.charge = c.answer.charge
		}
	}
	if !c.unchecked {
		r.mu.Unlock()
		r.checkRecorded(c)
		r.mu.Lock()
	}
}

// resumer is the app's Resumer: it rebuilds a pending action from the
// app's own records (which intent the key was minted for; else the action
// id or the body) and reconciles an outcome-unknown one by asking the
// payment server about its key.
type resumer struct {
	r      *runner
	p      *process
	pause  chan struct{}
	mu     sync.Mutex
	calls  map[string]*call // by listed action id
	bodies []*trackedBody
}

func (rs *resumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	r := rs.r
	if rs.pause != nil {
		t := time.NewTimer(300 * time.Millisecond)
		select {
		case <-rs.pause:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	i := r.intentOfRecord(rec)
	if i == nil {
		return nil, nil // not the app's: left pending
	}
	c := r.newCall(i, rs.p, callResume)
	c.resumeKey = rec.Key
	rs.mu.Lock()
	rs.calls[rec.ActionID] = c
	rs.mu.Unlock()
	req, body := requestFor(context.WithValue(ctx, callCtxKey{}, c), r.net.url(), i, c, c.n%2 == 0)
	c.startSeq, c.start = r.rec.next(), time.Now()
	c.markJoined(0)
	rs.mu.Lock()
	rs.bodies = append(rs.bodies, body)
	rs.mu.Unlock()
	if rs.pause != nil && i.kind == unnamed && rs.p.opts.dupWindow == 0 && rand.IntN(2) == 0 && r.firstRepeatDuring(i) {
		rs.repeatDuring(c, i)
	}
	return req, nil
}

// repeatDuring starts a deliberate repeat of i, a finished unnamed payment
// (a tap finished it while this Rebuild was paused) whose resend c Resume
// is about to send, and holds c's request at the network until the repeat
// has chosen its flight (the tap gate): the repeat meets Resume's flight
// of a done action in the air, as in issue 26 item 1, and must be charged
// as a payment of its own, never handed that flight's replay.
func (rs *resumer) repeatDuring(c *call, i *intent) {
	r := rs.r
	rep := r.newRepeatIntent(i)
	if rep == nil {
		return
	}
	rc := r.newCall(rep, rs.p, callPay)
	c.group = &tapGroup{calls: []*call{rc}}
	r.rec.logf("resume: %s repeats %s while %s resends it", rc.name, i.name, c.name)
	r.async.Add(1)
	rs.p.calls.Add(1)
	go func() {
		defer r.async.Done()
		defer rs.p.calls.Done()
		r.doCall(rc, op{kind: opRepeat, callers: 1})
	}()
}

// firstRepeatDuring reports whether i is finished (the app has learnt its
// final answer) and no repeat of it was made during a resend before: one
// repeat per intent, so that two deliberate repeats joined to two resends
// of i (two Resumes) are not taken for one double tap (each goes again when
// its own resend lands, and the second, arriving after the first was
// charged, is a payment of its own to the Transport).
func (r *runner) firstRepeatDuring(i *intent) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !i.finished || i.repeatedDuring {
		return false
	}
	i.repeatedDuring = true
	return true
}

func (rs *resumer) Resolve(ctx context.Context, rec journal.Record) (bool, error) {
	r := rs.r
	charged := len(r.net.srv.ChargesUnder(rec.Key)) > 0
	ev := resolveEvent{seq: r.rec.next(), rec: rec, trueAt: r.clk.trueSince(), earlier: r.earlierNow(rs.p),
		window: rs.p.opts.keyWindow, settle: rs.p.opts.settle, inAir: r.net.keysInAir(rec.Key), charged: charged}
	r.rec.mu.Lock()
	r.rec.resolves = append(r.rec.resolves, ev)
	r.rec.mu.Unlock()
	i := r.intentOfRecord(rec)
	x := rand.IntN(8)
	if x == 0 {
		return false, nil // the app looks later
	}
	r.forgotAt.LoadOrStore(rec.Key, ev.seq)
	if i != nil {
		r.mu.Lock()
		if charged {
			if !i.finished {
				i.finished, i.paid, i.status, i.finishedSeq = true, true, http.StatusCreated, ev.seq
			}
			i.reconciled = true
		} else {
			i.forgottenKeys[rec.Key] = true
		}
		r.mu.Unlock()
	}
	return true, nil
}

// intentOfRecord finds the intent a journal record is for: the intent whose
// call minted its key, else by its action id.
func (r *runner) intentOfRecord(rec journal.Record) *intent {
	if c, ok := r.mintOf.Load(rec.Key); ok {
		return c.(*call).intent
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range r.intents {
		switch {
		case i.kind == named && i.action == rec.ActionID, i.kind == keyed && "key:"+i.key == rec.ActionID:
			return i
		}
	}
	var last *intent
	for _, i := range r.intents {
		if i.kind == unnamed && fingerprintID(r.net.url(), i.bodyBytes()) == rec.ActionID {
			if !i.finished {
				return i
			}
			last = i
		}
	}
	return last
}

func (r *runner) resume(p *process, o op) {
	rs := &resumer{r: r, p: p, calls: make(map[string]*call)}
	if o.pause {
		r.mu.Lock()
		rs.pause = r.release
		r.mu.Unlock()
	}
	run := func() {
		results, err := p.tr.Resume(p.ctx, rs, 0)
		r.settleResume(rs, results, err)
		rs.mu.Lock()
		for _, b := range rs.bodies {
			if !b.closed.Load() && !p.dead.Load() {
				r.violate("request-body-closed", "a request Resume rebuilt was not closed by the time Resume returned")
				break
			}
		}
		rs.mu.Unlock()
	}
	if !o.async {
		run()
		return
	}
	r.async.Add(1)
	p.calls.Add(1)
	go func() {
		defer r.async.Done()
		defer p.calls.Done()
		run()
	}()
}

func (r *runner) settleResume(rs *resumer, results []idemretry.ResumeResult, err error) {
	for _, res := range results {
		rs.mu.Lock()
		c := rs.calls[res.Record.ActionID]
		rs.mu.Unlock()
		if c == nil {
			continue
		}
		r.mu.Lock()
		c.status, c.err = res.Status, res.Err
		c.outcome, c.hasOutcome = res.Outcome, true
		c.resumeBody, c.resumeTrunc = res.Body, res.BodyTruncated
		if res.Status != 0 && res.Err != nil {
			c.giveUp, c.err = res.Err, nil
		}
		c.endSeq, c.end = r.rec.next(), time.Now()
		r.mu.Unlock()
		if !res.Sent {
			r.rec.mu.Lock()
			for _, ev := range r.rec.net {
				if ev.call == c && ev.delivered && !rs.p.dead.Load() {
					r.rec.mu.Unlock()
					r.violate("resume-sent", "%s (Resume of %s, key %s): ResumeResult.Sent is false, but its request reached the server (%s)",
						c.name, res.Record.ActionID, res.Record.Key, ev.outcome)
					r.rec.mu.Lock()
					break
				}
			}
			r.rec.mu.Unlock()
		}
		r.learn(c)
	}
}

// crash kills process p: it sends and writes nothing more, its calls end
// unseen, and a new process starts on what its journal left (the file
// journal: the files as they were; PostgreSQL and memory: the records).
func (r *runner) crash(p *process) error {
	p.diedSeq.Store(r.rec.next())
	p.dead.Store(true)
	p.cancel()
	r.rec.logf("crash %s", p.name)
	if err := r.st.crashCopy(); err != nil {
		return err
	}
	old := p.j
	go func() {
		p.calls.Wait()
		r.closeJournal(old)
	}()
	if err := r.startProcess(p.machine); err != nil {
		return err
	}
	r.checkDoneSurvives(p, r.procs[p.machine])
	return nil
}

func (r *runner) restart(p *process) error {
	if !waitTimeout(&p.calls, 20*time.Second) {
		r.violate("bounded", "%s: calls still running 20 s after a restart was asked for", p.name)
	}
	if err := p.tr.Close(); err != nil {
		r.rec.logf("close %s: %v", p.name, err)
	}
	p.dead.Store(true)
	p.diedSeq.Store(r.rec.next())
	p.cancel()
	r.closeJournal(p.j)
	return r.startProcess(p.machine)
}

// A group counts calls in the air, as a sync.WaitGroup does, with a wait
// that may time out: a WaitGroup's Wait cannot, and one left waiting on a
// goroutine of its own panics ("WaitGroup is reused before previous Wait
// has returned") when a call starts just as the count reaches zero.
type group struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n reaches zero
}

func (g *group) Add(d int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		g.zero = make(chan struct{})
	}
	g.n += d
	if g.n == 0 {
		close(g.zero)
	}
}

func (g *group) Done() { g.Add(-1) }

// idle returns a channel closed once no call is in the air.
func (g *group) idle() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		return closedChan
	}
	return g.zero
}

func (g *group) Wait() { <-g.idle() }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// waitTimeout waits until g has no call in the air, for d at most, and
// reports whether it has none.
func waitTimeout(g *group, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-g.idle():
		return true
	case <-t.C:
		return false
	}
}

// awaitAll waits for every call in the air, paused Rebuilds let go first.
func (r *runner) awaitAll(d time.Duration) {
	r.mu.Lock()
	close(r.release)
	r.release = make(chan struct{})
	r.mu.Unlock()
	if !waitTimeout(&r.async, d) {
		r.violate("bounded", "calls still running %v after they were awaited", d)
	}
}

func (r *runner) waitIdle(d time.Duration) {
	end := time.Now().Add(d)
	for !r.net.idle() && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
	if r.net.loop != nil {
		// A request the client gave up on may still be in the socket's
		// buffers, on its way to the server.
		time.Sleep(50 * time.Millisecond)
		for !r.net.idle() && time.Now().Before(end) {
			time.Sleep(time.Millisecond)
		}
	}
}

// finish lets every paused Rebuild go, waits for every call, checks what
// only the end can tell, and closes everything.
func (r *runner) finish() {
	r.mu.Lock()
	close(r.release)
	r.release = make(chan struct{})
	r.mu.Unlock()
	if !waitTimeout(&r.async, 30*time.Second) {
		r.violate("bounded", "calls still running 30 s after the history's last step")
		r.waitIdle(time.Second)
	}
	r.checkHeldOpen()
	r.checkDoneIsFinal()
	r.mu.Lock()
	held, cancels := r.heldOpen, r.heldCancels
	r.heldOpen, r.heldCancels = nil, nil
	r.mu.Unlock()
	for _, b := range held {
		b.Close()
	}
	for _, c := range cancels {
		c()
	}
	for _, p := range r.procs {
		if p == nil || p.dead.Load() {
			continue
		}
		if err := p.tr.Close(); err != nil {
			r.rec.logf("close %s: %v", p.name, err)
		}
		p.dead.Store(true)
		p.cancel()
		r.closeJournal(p.j)
	}
	for _, p := range r.all {
		waitTimeout(&p.calls, 5*time.Second)
		p.cancel()
	}
	r.net.close()
}

func (r *runner) cleanup() {
	r.st.close()
}

// fingerprintID is the action id the Transport gives an unnamed POST of
// body to url: "fp:" and the hex SHA-256 of method, URL and the body's
// SHA-256 (fingerprint.go; TestFingerprintIDMatchesTheTransport holds the
// simulation to it).
func fingerprintID(url string, body []byte) string {
	bs := sum(body)
	b := append([]byte(http.MethodPost+"\x00"+url+"\x00"), bs[:]...)
	fp := sum(b)
	return "fp:" + hex.EncodeToString(fp[:])
}
