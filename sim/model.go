package sim

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// The model holds what the user meant: intents. An intent is one thing the
// user meant to do once (pay order 7); every request the app makes for it is
// a call. The app names an intent one of three ways, as a payment app may:
// WithAction (named), an Idempotency-Key of its own (keyed), or not at all
// (unnamed, named by the Transport's fingerprint of method, URL and body).
//
// Which calls belong to which intent is the app's decision, made as the user
// would make it: a call made while the intent is unfinished (no final answer
// learnt yet: in flight, or ended with an error) is the same intent (a tap,
// a retry); a deliberate repeat of a finished unnamed payment is a new
// intent with the same body. The checks hold the Transport to that.

type intentKind uint8

const (
	named intentKind = iota
	keyed
	unnamed
)

func (k intentKind) String() string {
	switch k {
	case named:
		return "named"
	case keyed:
		return "keyed"
	}
	return "unnamed"
}

// bodies are the payloads intents carry. Few, so that unnamed payments
// collide; one of 600 bytes, so that named ones get keyed fingerprints.
var bodies = func() [][]byte {
	b := [][]byte{[]byte(`{"amount":1000,"currency":"eur"}`), []byte(`{"amount":2500,"currency":"eur"}`), []byte(`{"amount":99,"currency":"usd"}`)}
	long := []byte(`{"amount":7000,"currency":"eur","note":"`)
	for len(long) < 600 {
		long = append(long, 'x')
	}
	return append(b, append(long, `"}`...))
}()

// payPath is where every payment goes.
const payPath = "/v1/payments"

type intent struct {
	n      int
	name   string // "i3": sent as paytest.IntentHeader
	kind   intentKind
	action string // named: the WithAction id
	key    string // keyed: the app's own key, bare
	// sdk: named, and every call carries a new random key of its own, as
	// an SDK that mints one per call does (stripe-go): the action keeps
	// the key of its first request, the journaled one (WithAction).
	sdk  bool
	body int // index in bodies
	// repeatOf is the finished intent this one deliberately repeats.
	repeatOf *intent

	// Guarded by the runner's mu.
	finished bool // a final answer was learnt (or Resolve found it charged)
	// repeatedDuring: a deliberate repeat of it was made while Resume
	// resent it (resumer.repeatDuring).
	repeatedDuring bool
	// finishedSeq is when it was learnt: a call of the intent that chose
	// its flight after that was a tap that came after the first finished.
	finishedSeq int64
	status      int    // the final status learnt
	paid        bool   // told a 2xx
	charge      string // the charge the answer named, if read
	calls       []*call
	// reconciled: Resolve found it charged and the app forgot its record:
	// paid, never sent again.
	reconciled bool
	// mintedAt is when its first key was minted, true time, if minted.
	mintedAt time.Duration
	minted   bool
	// forgotten: Resolve found it not charged and Forget dropped its key:
	// a new key for it is right.
	forgottenKeys map[string]bool
}

func (i *intent) bodyBytes() []byte { return bodies[i.body] }

// callKind says why a call was made.
type callKind uint8

const (
	callPay    callKind = iota // a pay or a send again
	callResume                 // Resume's rebuilt request
)

type call struct {
	n      int
	name   string // "c12": sent as hdrCall
	intent *intent
	proc   *process
	kind   callKind
	group  *tapGroup // the callers started together, or nil
	op     int       // the op that made it

	startSeq, endSeq int64
	start, end       time.Time // real
	deadline         time.Time // real, zero without one
	// joinSeq is when the Transport first asked for the call's context's
	// Done channel: after it decided to lead or join a flight (nothing
	// before that step reads Done). 0 if never.
	joinSeq atomic.Int64
	joined  chan struct{} // closed at join, or at the call's end
	once    sync.Once

	cancelSeq atomic.Int64 // when the caller cancelled it (0: never)
	// cancelIn is the attempt whose base RoundTrip the cancel came in,
	// done before its answer was returned (cancel-after), or 0: no request
	// of the call may follow that attempt.
	cancelIn  atomic.Int32
	cancelAt  atomic.Int64 // and when, real time (Unix ns)
	cancelFn  func()
	reqCancel chan struct{} // Request.Cancel, if the call uses it
	far       bool          // its deadline is 292 years ahead

	attempts atomic.Int32 // requests it made, as the network saw them

	// Results, set when it returns.
	status   int
	respBody []byte
	readErr  error
	err      error
	giveUp   error
	replay   bool
	answer   answerSeen
	readMode readMode
	getBody  bool
	// withinWindow: a repeat within the duplicate window, which must be
	// answered with the first's replay, under its key.
	withinWindow bool
	heldOpen     bool // its body is left unclosed (readNoClose): exempt from the close check
	unchecked    bool // its process died before it returned: the app never saw the result
	note         string
	resumeKey    string // the key of the record Resume listed, for its rebuilt call
	// wroteKey is the key the app set on the request (a keyed intent's,
	// or an SDK's new one), bare, and keyQuoted the form it wrote it in.
	wroteKey  string
	keyQuoted bool
	// outcome is what OutcomeOf said of what RoundTrip returned (or the
	// ResumeResult's Outcome), when hasOutcome.
	outcome    idemretry.Outcome
	hasOutcome bool
	// resumeBody is the Body of its ResumeResult, and resumeTrunc its
	// BodyTruncated.
	resumeBody  []byte
	resumeTrunc bool
}

// answerSeen is what the app read of a charge's answer.
type answerSeen struct {
	ok     bool
	charge string
	intent string
	key    string
}

func (c *call) markJoined(seq int64) {
	c.once.Do(func() {
		if seq != 0 {
			c.joinSeq.Store(seq)
		}
		close(c.joined)
	})
}

// final reports whether the call learnt a final answer, and its status.
func (c *call) final() (int, bool) {
	switch {
	case c.err == nil && c.status != 0 && c.giveUp == nil:
		return c.status, true
	case c.err != nil:
		var ae *idemretry.ActionError
		if errors.As(c.err, &ae) && errors.Is(c.err, idemretry.ErrResponseNotShared) && finalStatus(ae.Status) {
			// The answer's status, without its body (README: "the others
			// get ErrResponseNotShared with the status"). A status the
			// Transport retries (409, 429, 5xx) may be the last of a
			// flight that gave up: not final.
			return ae.Status, true
		}
	}
	return 0, false
}

// finalStatus reports whether DefaultRetryPolicy takes status, alone, for a
// final answer.
func finalStatus(status int) bool {
	switch {
	case status == 0, status == 409, status == 429:
		return false
	case status >= 500:
		return status == 501 || status == 505
	}
	return true
}

// tapGroup is the callers of one intent started together.
type tapGroup struct {
	calls []*call
}

// readMode is what the app does with an answer's body.
type readMode uint8

const (
	readAll     readMode = iota // read to EOF, then Close
	readNoClose                 // read to EOF, never Close
	readNone                    // Close unread
)

// callCtxKey carries the call in its context, for the journal layer.
type callCtxKey struct{}

func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callCtxKey{}).(*call)
	return c
}

// probeCtx is a call's context: the Transport reads its Done channel first
// once it has chosen to lead or to join a flight, which the tap gate waits
// for (see network). Before that only newBody asks for Done, for a body
// without GetBody, around its read of the body into memory, and
// body.hashInto, around the fingerprint's read of a GetBody copy, directly and
// through context.AfterFunc, whose goroutine may ask at any time later:
// those calls are not the flight's choice, and are told apart by who makes
// them (bodyPhase).
type probeCtx struct {
	context.Context
	c   *call
	rec *recorder
}

func (p *probeCtx) Done() <-chan struct{} {
	if p.c.joinSeq.Load() == 0 && !bodyPhase() {
		p.c.markJoined(p.rec.next())
	}
	return p.Context.Done()
}

// bodyPhase reports whether the Done call being made comes from the
// reading of a request body (idemretry's newBody, directly or through the
// context.AfterFunc it sets up) or from a goroutine of the context package
// that runs no idemretry code (AfterFunc's watch, which may ask at any
// time later), rather than from the Transport's choice of a flight (which
// may ask through the context package too: a context derived from the
// caller's).
func bodyPhase() bool {
	var pcs [32]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	transport := false
	for {
		f, more := frames.Next()
		switch {
		case strings.HasSuffix(f.Function, "idemretry.newBody"), strings.HasSuffix(f.Function, "idemretry.(*body).hashInto"):
			return true
		case strings.HasPrefix(f.Function, "github.com/idemretry/idemretry."):
			transport = true
		}
		if !more {
			return !transport
		}
	}
}

// recorder is one history's log, every entry with a sequence number from
// one counter, so that entries of different goroutines can be ordered where
// one happened before the other.
type recorder struct {
	seq atomic.Int64

	mu       sync.Mutex
	net      []*netEvent
	events   []transportEvent
	reserves []reserveEvent
	writes   []writeEvent
	resolves []resolveEvent
	lines    []string // a trace, printed with a failing history
}

func (r *recorder) next() int64 { return r.seq.Add(1) }

func (r *recorder) logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.lines = append(r.lines, s)
	r.mu.Unlock()
}

// netEvent is one request as the network saw it.
type netEvent struct {
	seq      int64
	endSeq   int64
	call     *call // nil if it named none
	proc     *process
	attempt  int // of its call, from 1
	keys     []string
	key      string // bare
	keyRaw   string
	bodyHash [32]byte
	bodyLen  int
	fault    fault
	trueAt   time.Duration
	realAt   time.Time
	// Set as it goes.
	delivered bool // the server processed it
	outcome   string
	charge    string
	status    int
	ra        time.Duration // the Retry-After its answer carried, if any
	damaged   bool          // its answer's body was cut or stalled on purpose
}

type transportEvent struct {
	seq    int64
	proc   *process
	ev     idemretry.Event
	realAt time.Time
}

type reserveEvent struct {
	seq       int64
	proc      *process
	call      *call
	actionID  string
	key       string
	form      journal.KeyForm // the record's, as Reserve returned it
	wantKey   string          // the key the Transport asked to create with
	created   bool
	createdAt time.Time     // wall, as recorded
	trueAt    time.Duration // true time of the reservation
	err       error
}

type writeEvent struct {
	seq      int64
	proc     *process
	call     *call
	rec      journal.Record
	sync     bool // a Sync, not an Update
	injected bool // the fault layer failed or delayed it on purpose
	err      error
	// ctxEndedAtEntry: the call's context had ended before it began.
	ctxEndedAtEntry bool
	left            time.Duration // until its context's deadline, when it ended
	deadline        time.Time
	hasDeadline     bool
}

type resolveEvent struct {
	seq    int64
	rec    journal.Record
	trueAt time.Duration
	// earlier is the earlier of the clock and the journal's time when
	// Resolve was called; window and settle are the Transport's.
	earlier        time.Time
	window, settle time.Duration
	inAir          int // requests of the key in the air then
	charged        bool
}

func sum(b []byte) [32]byte { return sha256.Sum256(b) }

// requestFor makes a call's request. The body has GetBody or not (streamed
// or buffered by the Transport), and counts its Close.
func requestFor(ctx context.Context, url string, i *intent, c *call, getBody bool) (*http.Request, *trackedBody) {
	b := &trackedBody{data: i.bodyBytes()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, b)
	if err != nil {
		panic(err) // a fixed URL
	}
	req.ContentLength = int64(len(b.data))
	if getBody {
		data := b.data
		req.GetBody = func() (io.ReadCloser, error) { return &trackedBody{data: data}, nil }
	} else {
		req.GetBody = nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hdrCall, c.name)
	req.Header.Set(intentHeader, i.name)
	switch {
	case i.kind == keyed:
		// Written bare or quoted, as the app's code has it: "K" and K name
		// one key, and the first form sent is the key's for good.
		c.wroteKey, c.keyQuoted = i.key, c.n%3 == 0
	case i.sdk:
		// An SDK's key, new on every call, in the form the SDK writes.
		c.wroteKey, c.keyQuoted = fmt.Sprintf("sdk-%x", randBytes(8)), c.n%4 == 1
	}
	if c.wroteKey != "" {
		k := c.wroteKey
		if c.keyQuoted {
			k = `"` + k + `"`
		}
		req.Header.Set("Idempotency-Key", k)
	}
	return req, b
}
