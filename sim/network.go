package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemretry/idemretry/internal/paytest"
)

// Headers the simulation adds to requests: which call sent it, and, over
// loopback, what the server side of the network does to it.
const (
	hdrCall      = "Sim-Call"
	hdrFault     = "Sim-Fault"
	hdrHold      = "Sim-Hold"
	intentHeader = paytest.IntentHeader
)

// faultKind is what the network does to one request.
type faultKind uint8

const (
	fNone         faultKind = iota
	fRefuse                 // the dial is refused: nothing is written
	fLost                   // the server charges; the answer is lost on the way back
	fReset                  // the answer's body is cut half way
	fStall                  // the answer's body stalls half way (real time), then ends
	fSlow                   // the answer comes late (real time): past a short deadline
	f503                    // a proxy answers 503, no Retry-After
	f503RA                  // a proxy answers 503 with Retry-After
	f429                    // a proxy answers 429, no Retry-After
	f429RA                  // a proxy answers 429 with Retry-After
	fHintFinal              // a proxy answers 503 with Stripe-Should-Retry: false (final)
	fHintRetry              // a proxy answers 400 with X-Should-Retry: true (retried)
	fHold                   // the server holds the charge (real time): its key is in flight, 409 meanwhile
	fCancelBefore           // the caller cancels before the request leaves
	fCancelAfter            // the caller cancels as the answer arrives (the server's, or a proxy's 503: busy)
	fUpgrade                // a proxy answers 101 Switching Protocols with a connection that stalls
	fHugeRA                 // a proxy answers 503 with a Retry-After of about 292 years
	nFaults
)

var faultNames = [...]string{"none", "refuse", "lost", "reset", "stall", "slow", "503", "503+RA", "429", "429+RA",
	"hint-final", "hint-retry", "hold", "cancel-before", "cancel-after", "upgrade", "huge-RA"}

func (k faultKind) String() string { return faultNames[k] }

type fault struct {
	kind faultKind
	d    time.Duration // real: how long a stall, slow answer or hold lasts
	ra   int64         // seconds of Retry-After (int64: hugeRA does not fit a 32-bit int)
	// busy: a cancel-after's answer is a proxy's 503, which the Transport
	// would retry were it not for the cancel.
	busy bool
}

func (f fault) String() string {
	switch f.kind {
	case fStall, fSlow, fHold:
		return fmt.Sprintf("%v(%v)", f.kind, f.d)
	case f503RA, f429RA, fHugeRA:
		return fmt.Sprintf("%v(%ds)", f.kind, f.ra)
	case fCancelAfter:
		if f.busy {
			return "cancel-after(503)"
		}
	}
	return f.kind.String()
}

// hugeRA is a Retry-After whose duration is within a nanosecond second of
// the largest time.Duration: a wait added to it overflows.
const hugeRA = 9223372036

// faultPlan draws the fault of a call's attempt from the history's seed,
// the call's number and the attempt's: the same for the same history
// whatever the interleaving of goroutines.
type faultPlan struct {
	seed    uint64
	weights [nFaults]int
	total   int
}

func (p *faultPlan) draw(callN, attempt int) fault {
	r := rand.New(rand.NewPCG(p.seed^0x9e3779b97f4a7c15, uint64(callN)<<20|uint64(attempt)))
	if p.total == 0 {
		return fault{}
	}
	x := r.IntN(p.total)
	k := fNone
	for i, w := range p.weights {
		if x < w {
			k = faultKind(i)
			break
		}
		x -= w
	}
	f := fault{kind: k}
	switch k {
	case fStall:
		f.d = []time.Duration{2 * time.Millisecond, 30 * time.Millisecond, 250 * time.Millisecond}[r.IntN(3)]
	case fSlow:
		f.d = []time.Duration{1 * time.Millisecond, 15 * time.Millisecond, 120 * time.Millisecond}[r.IntN(3)]
	case fHold:
		f.d = []time.Duration{1 * time.Millisecond, 10 * time.Millisecond, 60 * time.Millisecond}[r.IntN(3)]
	case f503RA, f429RA:
		f.ra = []int64{1, 2, 5, 45}[r.IntN(4)] // 45 s is past DefaultMaxRetryAfter
	case fHugeRA:
		f.ra = hugeRA
	case fCancelAfter:
		f.busy = r.IntN(2) == 0
	}
	return f
}

// network is a history's network: in memory (a RoundTripper that calls the
// payment server's handler, no sockets) or over loopback (a real
// http.Transport and an httptest server, with the server side of each fault
// done by a handler in front of the payment server: a hijacked and closed
// connection, a body cut or stalled on the wire).
type network struct {
	r        *runner
	srv      *paytest.Server
	plan     *faultPlan
	handlers sync.WaitGroup // the server's goroutines (in memory)

	// loopback, if not nil.
	loop       *httptest.Server
	real       *http.Transport
	closedAddr string

	serving atomic.Int32 // the server's goroutines running

	mu     sync.Mutex
	inAir  map[string]int // key -> requests in the air, client side
	bodies []*simBody
}

func (n *network) url() string {
	if n.loop != nil {
		return n.loop.URL + payPath
	}
	return "http://pay.sim" + payPath
}

func newNetwork(r *runner, loopback bool) *network {
	n := &network{r: r, plan: r.h.faults, inAir: make(map[string]int)}
	n.srv = paytest.New(paytest.WithClock(r.clk.TrueNow), paytest.WithKeyWindow(serverWindow),
		paytest.WithProcessing(func(_ int, req *http.Request) {
			if d, err := time.ParseDuration(req.Header.Get(hdrHold)); err == nil && d > 0 {
				time.Sleep(d)
			}
		}))
	if loopback {
		n.loop = httptest.NewServer(http.HandlerFunc(n.serveLoopback))
		n.real = &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			n.closedAddr = l.Addr().String()
			l.Close()
		}
	}
	return n
}

// close ends the network: the loopback server and its connections.
func (n *network) close() {
	if n.loop != nil {
		n.real.CloseIdleConnections()
		n.loop.CloseClientConnections()
		n.loop.Close()
	}
	n.handlers.Wait()
}

// base is the RoundTripper of one process (a Transport's base).
type base struct {
	n *network
	p *process
}

var errDead = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("sim: the process is dead")}

func refused() error { return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED} }

func reset() error {
	return &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}

// RoundTrip implements http.RoundTripper.
func (b *base) RoundTrip(req *http.Request) (*http.Response, error) {
	n, r := b.n, b.n.r
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("sim: reading the request body: %w", err)
		}
	}
	if b.p.dead.Load() {
		return nil, errDead
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, err // as net/http: nothing leaves under an ended context
	}
	c := r.callNamed(req.Header.Get(hdrCall))
	ev := &netEvent{seq: r.rec.next(), call: c, proc: b.p, bodyHash: sum(body), bodyLen: len(body),
		trueAt: r.clk.trueSince(), realAt: time.Now()}
	for k, vs := range req.Header {
		if strings.EqualFold(k, "Idempotency-Key") {
			ev.keys = append(ev.keys, vs...)
		}
	}
	if len(ev.keys) == 1 {
		ev.keyRaw = ev.keys[0]
		ev.key = paytestBare(ev.keyRaw)
	}
	if c != nil {
		ev.attempt = int(c.attempts.Add(1))
		ev.fault = n.plan.draw(c.n, ev.attempt)
	}
	r.rec.mu.Lock()
	r.rec.net = append(r.rec.net, ev)
	r.rec.mu.Unlock()
	n.mu.Lock()
	n.inAir[ev.key]++
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.inAir[ev.key]--
		n.mu.Unlock()
		r.rec.mu.Lock()
		ev.endSeq = r.rec.next()
		r.rec.mu.Unlock()
	}()
	if c != nil && c.group != nil {
		n.gate(ctx, c)
	}
	f := ev.fault
	switch f.kind {
	case fRefuse:
		r.rec.mu.Lock()
		ev.outcome = "refused"
		r.rec.mu.Unlock()
		if n.loop != nil && n.closedAddr != "" {
			out := req.Clone(ctx) // a real dial, refused
			out.URL.Host = n.closedAddr
			out.Body, out.GetBody = nil, nil
			out.ContentLength = 0
			resp, err := n.real.RoundTrip(out)
			if err == nil {
				resp.Body.Close()
				return nil, refused()
			}
			return nil, err
		}
		return nil, refused()
	case fCancelBefore:
		if c != nil {
			r.cancelCall(c)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.WroteRequest != nil {
		tr.WroteRequest(httptrace.WroteRequestInfo{})
	}
	var resp *http.Response
	var err error
	if n.loop != nil {
		resp, err = n.sendLoopback(req, body, ev)
	} else {
		resp, err = n.sendMemory(req, body, ev)
	}
	if err == nil && f.kind == fCancelAfter && c != nil && c.cancelFn != nil {
		r.cancelCall(c) // the answer is in hand as the caller gives up
		c.cancelIn.CompareAndSwap(0, int32(ev.attempt))
	}
	if resp != nil {
		r.rec.mu.Lock()
		ev.status = resp.StatusCode
		if f.ra > 0 && resp.Header.Get("Retry-After") != "" {
			ev.ra = time.Duration(min(f.ra, hugeRA)) * time.Second
		}
		r.rec.mu.Unlock()
	}
	return resp, err
}

// paytestBare is the bare form of a key header's value.
func paytestBare(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// gate holds a request of a call that was started with others of its
// intent (a double tap, N callers) until each of them has passed the point
// where the Transport chose to lead or to join a flight, or has ended: so
// that every one of them finds the flight in the air, and one that does not
// join it is the Transport's doing, not the scheduler's. It waits a second
// at most.
func (n *network) gate(ctx context.Context, c *call) {
	t := time.NewTimer(300 * time.Millisecond)
	defer t.Stop()
	for _, m := range c.group.calls {
		select {
		case <-m.joined:
		case <-t.C:
			n.r.rec.logf("gate: %s did not reach its flight within 300 ms", m.name)
			return
		case <-ctx.Done():
			return
		}
	}
}

// proxyAnswer returns the answer a proxy gives in front of the server, or
// nil if the request goes on to the server.
func proxyAnswer(f fault, key string) (status int, hdr http.Header, body string) {
	hdr = http.Header{"Content-Type": {"application/json"}}
	body = fmt.Sprintf(`{"error":"sim: %s","key":%q}`, f.kind, key)
	switch f.kind {
	case f503:
		return 503, hdr, body
	case fCancelAfter:
		if f.busy {
			return 503, hdr, body
		}
	case f503RA, fHugeRA:
		hdr.Set("Retry-After", strconv.FormatInt(f.ra, 10))
		return 503, hdr, body
	case f429:
		return 429, hdr, body
	case f429RA:
		hdr.Set("Retry-After", strconv.FormatInt(f.ra, 10))
		return 429, hdr, body
	case fHintFinal:
		hdr.Set("Stripe-Should-Retry", "false")
		return 503, hdr, body
	case fHintRetry:
		hdr.Set("X-Should-Retry", "true")
		return 400, hdr, body
	case fUpgrade:
		hdr = http.Header{"Upgrade": {"sim"}, "Connection": {"Upgrade"}}
		return 101, hdr, ""
	}
	return 0, nil, ""
}

// sendMemory hands the request to the payment server in memory.
func (n *network) sendMemory(req *http.Request, body []byte, ev *netEvent) (*http.Response, error) {
	ctx := req.Context()
	f := ev.fault
	if status, hdr, pbody := proxyAnswer(f, ev.key); status != 0 {
		n.noteProxy(ev, f)
		if status == http.StatusSwitchingProtocols {
			return &http.Response{Status: "101 Switching Protocols", StatusCode: 101, Header: hdr, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Body: n.newUpgraded(ev), Request: req, ContentLength: -1}, nil
		}
		return n.response(req, ev, status, hdr, []byte(pbody), fault{}), nil
	}
	hreq, err := http.NewRequest(req.Method, req.URL.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header = req.Header.Clone()
	hreq.Header.Set(hdrAttempt, strconv.Itoa(ev.attempt))
	if f.kind == fHold {
		hreq.Header.Set(hdrHold, f.d.String())
	}
	rw := httptest.NewRecorder()
	done := make(chan struct{})
	n.handlers.Add(1)
	n.serving.Add(1)
	go func() {
		defer n.handlers.Done()
		defer n.serving.Add(-1)
		defer close(done)
		n.srv.ServeHTTP(rw, hreq)
		n.noteServed(ev, rw.Code, rw.Header(), rw.Body.Bytes())
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err() // the server goes on, and may charge
	//lint:ignore SA1019 the simulation honours the deprecated Request.Cancel as net/http still does
	case <-req.Cancel:
		return nil, errors.New("net/http: request canceled")
	}
	switch f.kind {
	case fLost:
		return nil, reset()
	case fSlow:
		t := time.NewTimer(f.d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		//lint:ignore SA1019 the simulation honours the deprecated Request.Cancel as net/http still does
		case <-req.Cancel:
			return nil, errors.New("net/http: request canceled")
		}
	}
	res := rw.Result()
	data := rw.Body.Bytes()
	return n.response(req, ev, res.StatusCode, res.Header, data, f), nil
}

func (n *network) noteProxy(ev *netEvent, f fault) {
	n.r.rec.mu.Lock()
	ev.outcome = "proxy " + f.kind.String()
	n.r.rec.mu.Unlock()
}

// noteServed records what the server did with ev's request, read from its
// answer.
func (n *network) noteServed(ev *netEvent, status int, hdr http.Header, data []byte) {
	outcome, charge := outcomeOf(status, hdr, data)
	n.r.rec.mu.Lock()
	ev.delivered, ev.outcome, ev.charge = true, outcome, charge
	n.r.rec.mu.Unlock()
}

// outcomeOf reads what the payment server did from its answer.
func outcomeOf(status int, hdr http.Header, data []byte) (outcome, charge string) {
	a, ok := paytest.ParseAnswer(data)
	switch {
	case ok && hdr.Get("Idempotent-Replayed") == "true":
		return paytest.Replayed.String(), a.Charge
	case ok:
		return paytest.Charged.String(), a.Charge
	case status == http.StatusConflict:
		return paytest.InFlight.String(), ""
	case status == http.StatusUnprocessableEntity:
		return paytest.Mismatch.String(), ""
	}
	return fmt.Sprintf("status %d", status), ""
}

const hdrAttempt = "Sim-Attempt"

// upgradeStall is how long an upgraded connection stays silent: longer than
// a short deadline and OutcomeGrace, so that a RoundTrip it holds up shows.
const upgradeStall = 3 * time.Second

func attemptOf(h http.Header) int {
	a, _ := strconv.Atoi(h.Get(hdrAttempt))
	return a
}

// response makes the answer the caller's side of the network receives, its
// body cut or stalled as the fault says.
func (n *network) response(req *http.Request, ev *netEvent, status int, hdr http.Header, data []byte, f fault) *http.Response {
	//lint:ignore SA1019 the simulation honours the deprecated Request.Cancel as net/http still does
	b := &simBody{data: data, ctx: req.Context(), cancel: req.Cancel, closed: make(chan struct{}), call: ev.call, cut: -1, stallAt: -1}
	switch f.kind {
	case fReset:
		b.cut = len(data) / 2
	case fStall:
		b.stallAt, b.stall = len(data)/2, f.d
	}
	if f.kind == fReset || f.kind == fStall {
		n.r.rec.mu.Lock()
		ev.damaged = true
		n.r.rec.mu.Unlock()
	}
	n.mu.Lock()
	n.bodies = append(n.bodies, b)
	n.mu.Unlock()
	return &http.Response{Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: hdr, Body: b, ContentLength: int64(len(data)), Request: req}
}

// simBody is an answer's body in memory: cut at cut, stalled for stall at
// stallAt (ending early with its attempt's context), and it remembers
// whether it was closed.
type simBody struct {
	mu      sync.Mutex
	data    []byte
	off     int
	cut     int
	stallAt int
	stall   time.Duration
	stalled bool
	ctx     context.Context
	cancel  <-chan struct{}
	closed  chan struct{}
	isShut  bool
	call    *call
}

func (b *simBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.isShut {
		return 0, errors.New("sim: read on a closed body")
	}
	if b.cut >= 0 && b.off >= b.cut {
		return 0, io.ErrUnexpectedEOF
	}
	if b.stallAt >= 0 && b.off >= b.stallAt && !b.stalled {
		b.stalled = true
		b.mu.Unlock()
		t := time.NewTimer(b.stall)
		var err error
		select {
		case <-t.C:
		case <-b.ctx.Done():
			err = b.ctx.Err()
		case <-b.cancel:
			err = errors.New("net/http: request canceled")
		case <-b.closed:
			err = errors.New("sim: body closed")
		}
		t.Stop()
		b.mu.Lock()
		if err != nil {
			return 0, err
		}
	}
	if b.off >= len(b.data) {
		return 0, io.EOF
	}
	end := len(b.data)
	if b.cut >= 0 && end > b.cut {
		end = b.cut
	}
	if b.stallAt >= 0 && !b.stalled && end > b.stallAt {
		end = b.stallAt
	}
	k := copy(p, b.data[b.off:end])
	b.off += k
	return k, nil
}

func (b *simBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.isShut {
		b.isShut = true
		close(b.closed)
	}
	return nil
}

func (b *simBody) wasClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isShut
}

// upgraded is a 101's connection: it is not bound to the request's context
// (net/http hands an upgraded connection over), and stalls until it is
// closed or upgradeStall has passed.
type upgraded struct {
	simBody
}

func (u *upgraded) Read(p []byte) (int, error) {
	t := time.NewTimer(upgradeStall)
	defer t.Stop()
	select {
	case <-t.C:
		return 0, io.EOF
	case <-u.closed:
		return 0, errors.New("sim: connection closed")
	}
}

func (u *upgraded) Write(p []byte) (int, error) { return len(p), nil }

func (n *network) newUpgraded(ev *netEvent) io.ReadCloser {
	u := &upgraded{simBody{closed: make(chan struct{}), call: ev.call, cut: -1, stallAt: -1}}
	n.mu.Lock()
	n.bodies = append(n.bodies, &u.simBody)
	n.mu.Unlock()
	return u
}

// sendLoopback sends the request over a real socket to the loopback
// server, telling the server side what to do to it.
func (n *network) sendLoopback(req *http.Request, body []byte, ev *netEvent) (*http.Response, error) {
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	out.Header.Set(hdrFault, encodeFault(ev.fault))
	out.Header.Set(hdrAttempt, strconv.Itoa(ev.attempt))
	if ev.fault.kind == fHold {
		out.Header.Set(hdrHold, ev.fault.d.String())
	}
	if _, _, pbody := proxyAnswer(ev.fault, ev.key); pbody != "" || ev.fault.kind == fUpgrade {
		n.noteProxy(ev, ev.fault)
	}
	resp, err := n.real.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	resp.Request = req
	if ev.fault.kind == fReset || ev.fault.kind == fStall {
		n.r.rec.mu.Lock()
		ev.damaged = true
		n.r.rec.mu.Unlock()
	}
	tb := &trackedResp{ReadCloser: resp.Body, shadow: simBody{closed: make(chan struct{}), call: ev.call}}
	resp.Body = tb
	n.mu.Lock()
	n.bodies = append(n.bodies, &tb.shadow)
	n.mu.Unlock()
	return resp, nil
}

// trackedResp is a real answer's body that remembers its Close.
type trackedResp struct {
	io.ReadCloser
	shadow simBody
}

func (t *trackedResp) Close() error {
	t.shadow.Close()
	return t.ReadCloser.Close()
}

func encodeFault(f fault) string {
	busy := 0
	if f.busy {
		busy = 1
	}
	return fmt.Sprintf("%d %d %d %d", f.kind, f.d, f.ra, busy)
}

func decodeFault(s string) fault {
	var k, d, ra, busy int64
	fmt.Sscanf(s, "%d %d %d %d", &k, &d, &ra, &busy)
	return fault{kind: faultKind(k), d: time.Duration(d), ra: ra, busy: busy == 1}
}

// serveLoopback is the server side of the loopback network: a proxy's
// answers, then the payment server, its answer delivered as the fault
// says.
func (n *network) serveLoopback(w http.ResponseWriter, r *http.Request) {
	n.serving.Add(1)
	defer n.serving.Add(-1)
	f := decodeFault(r.Header.Get(hdrFault))
	key := paytestBare(r.Header.Get("Idempotency-Key"))
	if status, hdr, pbody := proxyAnswer(f, key); status != 0 {
		if status == http.StatusSwitchingProtocols {
			status = http.StatusServiceUnavailable // no upgrades over loopback
		}
		io.Copy(io.Discard, r.Body)
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		io.WriteString(w, pbody)
		return
	}
	rec := httptest.NewRecorder()
	n.srv.ServeHTTP(rec, r)
	n.noteServedLoop(r, rec)
	res := rec.Result()
	data := rec.Body.Bytes()
	switch f.kind {
	case fLost:
		paytest.HijackAndClose(w)
		return
	case fSlow:
		t := time.NewTimer(f.d)
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(res.StatusCode)
	switch f.kind {
	case fReset, fStall:
		half := len(data) / 2
		w.Write(data[:half])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		if f.kind == fReset {
			if h, ok := w.(http.Hijacker); ok {
				if conn, buf, err := h.Hijack(); err == nil {
					buf.Flush()
					conn.Close()
				}
			}
			return
		}
		t := time.NewTimer(f.d)
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
		w.Write(data[half:])
		return
	}
	w.Write(data)
}

func (n *network) noteServedLoop(r *http.Request, rec *httptest.ResponseRecorder) {
	c := n.r.callNamed(r.Header.Get(hdrCall))
	a := attemptOf(r.Header)
	outcome, charge := outcomeOf(rec.Code, rec.Header(), rec.Body.Bytes())
	n.r.rec.mu.Lock()
	defer n.r.rec.mu.Unlock()
	for i := len(n.r.rec.net) - 1; i >= 0; i-- {
		if ev := n.r.rec.net[i]; ev.call == c && ev.attempt == a {
			ev.delivered, ev.outcome, ev.charge = true, outcome, charge
			return
		}
	}
}

// keysInAir returns how many requests under key are in the air, client side.
func (n *network) keysInAir(key string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.inAir[key]
}

// idle reports whether no request is in the air and no server goroutine
// runs: in memory, the handlers; over loopback, the requests.
func (n *network) idle() bool {
	if n.serving.Load() > 0 {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, v := range n.inAir {
		if v > 0 {
			return false
		}
	}
	return true
}
