package idemretry_test

// "No limit": math.MaxInt64, the usual way to say it, for every limit a
// caller gives (a size, a duration, a deadline), means no limit, never a
// sum that wraps around to a negative one. Issue 26, items 7 to 11.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// noGetBody is a request body net/http cannot rewind: the Transport
// buffers it (WithMaxBufferedBody).
func noGetBody(s string) io.ReadCloser { return io.NopCloser(onlyReader{strings.NewReader(s)}) }

// ctxJournal is an in-memory journal whose calls honour their context, as
// a database's do: one made under an ended context fails. It syncs (a
// journal.Syncer) and counts its syncs.
type ctxJournal struct {
	*journal.Memory
	mu    sync.Mutex
	syncs int
}

func (j *ctxJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return journal.Record{}, false, err
	}
	return j.Memory.Reserve(ctx, rec, mode)
}

func (j *ctxJournal) Update(ctx context.Context, rec journal.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return j.Memory.Update(ctx, rec)
}

func (j *ctxJournal) Sync(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.mu.Lock()
	j.syncs++
	j.mu.Unlock()
	return nil
}

func (j *ctxJournal) synced() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.syncs
}

// A deadline ~292 years ahead (context.WithTimeout(ctx, math.MaxInt64), or
// an http.Client with that Timeout) bounds the outcome's journal write by
// the journal timeout, as no deadline does: the done is recorded (and,
// for an unnamed payment, synced), so a deliberate repeat is a new
// payment. Before: the write ran under an already-ended context; the
// journal kept the action pending, and the repeat was answered with the
// first payment's replay.
func TestFarDeadlineRecordsTheOutcome(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"context", "client"} {
		t.Run(how, func(t *testing.T) {
			srv := newPayServer(t)
			j := &ctxJournal{Memory: journal.NewMemory()}
			tr := transportOver(t, j)
			pay := func() {
				ctx, cancel := context.WithTimeout(context.Background(), math.MaxInt64)
				defer cancel()
				c := &http.Client{Transport: tr}
				if how == "client" {
					ctx, c = context.Background(), &http.Client{Transport: tr, Timeout: math.MaxInt64}
				}
				resp, err := c.Do(post(t, ctx, srv.URL, `{"amount":100}`))
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				readAll(t, resp)
			}
			pay()
			left, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Empty(t, left, "the answered payment is recorded done")
			require.Equal(t, 1, j.synced(), "an unnamed done is synced")
			pay() // the same payment again, deliberately
			require.Equal(t, 2, srv.chargeCount(), "a deliberate repeat is a new payment")
		})
	}
}

// WithMaxBufferedBody(math.MaxInt64) buffers a body without GetBody
// whole, and unnamed payments with different bodies are different
// actions. Before: every such body was sent empty, and all payments to
// one URL were one action.
func TestNoLimitBufferedBodyIsSentWhole(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithMaxBufferedBody(math.MaxInt64))
	bodies := []string{`{"amount":1}`, `{"amount":2}`}
	for _, b := range bodies {
		req := post(t, context.Background(), srv.URL, "")
		req.Body, req.GetBody, req.ContentLength = noGetBody(b), nil, int64(len(b))
		roundTrip(t, tr, req)
	}
	reqs := srv.seen()
	require.Len(t, reqs, 2)
	for i, b := range bodies {
		require.Equal(t, sha256.Sum256([]byte(b)), reqs[i].BodyHash, "body %d sent whole", i)
	}
	require.NotEqual(t, reqs[0].Key, reqs[1].Key, "two payments, two keys")
	require.Equal(t, 2, srv.chargeCount())
}

// WithMaxSharedResponse(math.MaxInt64) shares the answer whole with the
// callers that joined the flight, and leaves the leader's whole. Before:
// every caller got an empty body.
func TestNoLimitSharedResponseIsWhole(t *testing.T) {
	srv := newSlowPayServer(t, 100*time.Millisecond)
	tr, _, _ := newTestTransport(t, idemretry.WithMaxSharedResponse(math.MaxInt64))
	var mu sync.Mutex
	var got []string
	leaderThenJoiners(srv, 3, func() {
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":3}`))
		if err != nil {
			mu.Lock()
			got = append(got, "error: "+err.Error())
			mu.Unlock()
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		mu.Lock()
		got = append(got, fmt.Sprintf("%d %s %v", resp.StatusCode, b, err))
		mu.Unlock()
	})
	want := fmt.Sprintf("%d %s %v", http.StatusCreated, `{"charge":"ch_1"}`, nil)
	require.Equal(t, []string{want, want, want}, got)
	srv.requireOnePayment(t, 1)
}

// WithSettleTime(math.MaxInt64) never hands an outcome-unknown action to
// Resolve. Before: keyWindow + settle wrapped around, and Resolve was
// asked at once, inside the settle time.
func TestNoLimitSettleTimeKeepsResolveWaiting(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(http.StatusServiceUnavailable))
	tr, _, clk := newTestTransport(t, idemretry.WithKeyWindow(time.Hour), idemretry.WithSettleTime(math.MaxInt64),
		idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), "pay:settle")
	resp := roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":4}`))
	require.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted, "left pending")
	clk.Advance(2 * time.Hour)
	require.ErrorIs(t, sendErr(tr, post(t, ctx, srv.URL, `{"amount":4}`)), idemretry.ErrKeyWindowExpired)
	clk.Advance(100 * 365 * 24 * time.Hour) // a century after the window

	r := &resolveRecorder{}
	res, err := tr.Resume(context.Background(), r, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, idemretry.ErrOutcomeUnknown)
	require.Empty(t, r.asked, "Resolve is not asked within the settle time")
}

// resolveRecorder is a Resumer that records the actions Resolve is asked
// about, and keeps them.
type resolveRecorder struct {
	mu    sync.Mutex
	asked []string
}

func (r *resolveRecorder) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	return nil, fmt.Errorf("not rebuilt")
}

func (r *resolveRecorder) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, rec.ActionID)
	return false, nil
}

// WithMaxRetryAfter(math.MaxInt64) honours any Retry-After: one past the
// key window is not waited (the retries stop, ErrKeyWindowExpired), one
// within it is waited (at least as long as asked). Before: a Retry-After
// near the longest Duration, added to the backoff's wait, wrapped around,
// and the retry went out at once.
func TestNoLimitRetryAfterIsWaitedOrNotAtAll(t *testing.T) {
	for _, ra := range []string{"99999999999999999999", "9223372036", "120"} {
		t.Run(ra, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(status(http.StatusServiceUnavailable, "Retry-After", ra))
			tr, _, clk := newTestTransport(t, idemretry.WithMaxRetryAfter(math.MaxInt64))
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:ra"), srv.URL, `{"amount":5}`))
			if ra == "120" {
				require.NoError(t, err)
				readAll(t, resp)
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				require.Len(t, srv.seen(), 2)
				require.GreaterOrEqual(t, clk.Waits()[0], 120*time.Second, "Retry-After is a floor")
				return
			}
			require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired, "a wait past the key window does not start")
			require.Len(t, srv.seen(), 1, "no retry")
			require.Empty(t, clk.Waits())
		})
	}
}

// Every option that takes a count, a size or a duration, at its "no
// limit" (math.MaxInt64, math.MaxInt, +Inf tokens), with the other
// options at their defaults: a payment answered 503 then 201 is sent
// whole under one key, retried once, answered whole, and recorded done;
// and an unnamed repeat within the longest duplicate window is the same
// payment.
func TestNoLimitForEveryOption(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string][]idemretry.Option{
		"WithMaxRetries":        {idemretry.WithMaxRetries(math.MaxInt)},
		"WithMaxRetryAfter":     {idemretry.WithMaxRetryAfter(math.MaxInt64)},
		"WithKeyWindow":         {idemretry.WithKeyWindow(math.MaxInt64)},
		"WithMaxBufferedBody":   {idemretry.WithMaxBufferedBody(math.MaxInt64)},
		"WithRetryBudget":       {idemretry.WithRetryBudget(math.Inf(1), 1)},
		"WithDuplicateWindow":   {idemretry.WithKeyWindow(math.MaxInt64), idemretry.WithDuplicateWindow(math.MaxInt64 - 1)},
		"WithJournalTimeout":    {idemretry.WithJournalTimeout(math.MaxInt64)},
		"WithSettleTime":        {idemretry.WithSettleTime(math.MaxInt64)},
		"WithMaxSharedResponse": {idemretry.WithMaxSharedResponse(math.MaxInt64)},
		"WithLeaseTTL":          {idemretry.WithLeaseTTL(math.MaxInt64)},
		"all":                   {idemretry.WithMaxRetries(math.MaxInt), idemretry.WithMaxRetryAfter(math.MaxInt64), idemretry.WithKeyWindow(math.MaxInt64), idemretry.WithMaxBufferedBody(math.MaxInt64), idemretry.WithRetryBudget(math.Inf(1), 1), idemretry.WithJournalTimeout(math.MaxInt64), idemretry.WithSettleTime(math.MaxInt64), idemretry.WithMaxSharedResponse(math.MaxInt64), idemretry.WithLeaseTTL(math.MaxInt64)},
	} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(status(http.StatusServiceUnavailable, "Retry-After", "1"))
			j := &ctxJournal{Memory: journal.NewMemory()}
			clk := newFakeClock()
			tr := transportOver(t, j, append([]idemretry.Option{idemretry.WithClock(clk), idemretry.WithBackOff(constant(0))}, opts...)...)
			const body = `{"amount":7}`
			send := func() (*http.Response, string) {
				req := post(t, context.Background(), srv.URL, "")
				req.Body, req.GetBody, req.ContentLength = noGetBody(body), nil, int64(len(body))
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				return resp, readAll(t, resp)
			}
			resp, got := send()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, `{"charge":"ch_1"}`, got)
			reqs := srv.requireOnePayment(t, 2)
			for _, r := range reqs {
				require.Equal(t, sha256.Sum256([]byte(body)), r.BodyHash)
			}
			require.Equal(t, []time.Duration{time.Second}, clk.Waits(), "Retry-After waited, as asked")
			left, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Empty(t, left, "recorded done")
			if name == "WithDuplicateWindow" {
				send() // a repeat within the window: the same payment, replayed
				require.Equal(t, 1, srv.chargeCount())
			}
		})
	}
}

// fuzzServer is one loopback server for a whole fuzz run. Each input is a
// run of its own, under /run/<n>: the server keeps what that run's
// requests carried, answers its first request 503 with a Retry-After
// when asked (X-Fuzz-Retry-After), holds it until released when callers
// are to join its flight (X-Fuzz-Hold), and answers the others 201 with
// a body of X-Fuzz-Len bytes of pattern and, if given, a Content-Length
// header of X-Fuzz-CL.
type fuzzServer struct {
	*http.Server
	url  string
	mu   sync.Mutex
	runs map[string]*fuzzRun
	next int
}

type fuzzRun struct {
	mu      *sync.Mutex // the server's: a request cut mid-body may still be read after RoundTrip returned
	seen    []seen
	lens    []int
	arrived chan struct{}
	release chan struct{}
}

// fuzzPattern is the answer's body of n bytes.
func fuzzPattern(n int) string { return strings.Repeat("0123456789abcdef", n/16+1)[:n] }

func (s *fuzzServer) newRun(hold bool) (string, *fuzzRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := fmt.Sprint(s.next)
	r := &fuzzRun{mu: &s.mu, arrived: make(chan struct{}), release: make(chan struct{})}
	if !hold {
		close(r.release)
	}
	s.runs[id] = r
	return s.url + "/run/" + id, r
}

func (r *fuzzRun) requests() ([]seen, []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.seen...), append([]int(nil), r.lens...)
}

func (s *fuzzServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	s.mu.Lock()
	run := s.runs[strings.TrimPrefix(req.URL.Path, "/run/")]
	if run == nil {
		s.mu.Unlock()
		w.WriteHeader(http.StatusNotFound)
		return
	}
	run.seen = append(run.seen, seen{Key: req.Header.Get("Idempotency-Key"), BodyHash: sha256.Sum256(body)})
	run.lens = append(run.lens, len(body))
	n := len(run.seen)
	s.mu.Unlock()
	if n == 1 {
		close(run.arrived)
		select {
		case <-run.release:
		case <-req.Context().Done():
			return
		}
		if ra, ok := req.Header["X-Fuzz-Retry-After"]; ok {
			w.Header()["Retry-After"] = ra
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	if cl, ok := req.Header["X-Fuzz-Cl"]; ok {
		w.Header()["Content-Length"] = cl
	}
	var size int
	fmt.Sscan(req.Header.Get("X-Fuzz-Len"), &size)
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, fuzzPattern(size))
}

// fuzzHeaderValue reports whether v can be sent as a header's value as it
// is (net/http's server rewrites or refuses the others).
func fuzzHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return strings.TrimSpace(v) == v
}

// FuzzTransportLimits drives the Transport over loopback with random
// option values (0, 1, -1, math.MaxInt64, math.MinInt64 among the seeds),
// random Retry-After and Content-Length headers, and up to three callers
// sharing one flight, and checks the documented bounds: no panic;
// NewTransport refuses a value with ErrInvalidOption exactly when its
// option says so; a body without GetBody within WithMaxBufferedBody is
// sent whole, one over it is refused before anything is sent; every
// attempt of the action carries one key; a Retry-After over
// WithMaxRetryAfter is not waited, one that would end past the key window
// is not waited either, any other is waited exactly (the backoff adds
// nothing here); a shared answer within WithMaxSharedResponse is whole
// for every caller, one over it is the leader's whole and
// ErrResponseNotShared for the others; an answer that came is recorded
// done, under a deadline ~292 years ahead too; an outcome-unknown action
// goes to Resolve exactly when its key window and settle time have passed
// by the clock. Run it longer with
//
//	go test -run '^$' -fuzz '^FuzzTransportLimits$' -fuzztime 60s .
func FuzzTransportLimits(f *testing.F) {
	const (
		flagGetBody = 1 << iota
		flagFarDeadline
		flagJoin1
		flagJoin2
		flagRetryAfter
		flagRespCL
		flagReqCL
		flagNamed
	)
	type input struct {
		maxBuffered, maxShared, maxRetryAfter, keyWindow, settle, journalTimeout int64
		bodyLen, respLen                                                         uint16
		retryAfter, respCL                                                       string
		reqCL                                                                    int64
		flags                                                                    uint8
		advance                                                                  int64
	}
	const maxI, minI = math.MaxInt64, math.MinInt64
	day, sec := int64(24*time.Hour), int64(time.Second)
	for _, in := range []input{
		{1 << 20, 1 << 20, int64(30 * time.Second), day, int64(time.Minute), 5 * sec, 100, 100, "", "", 0, 0, 0},
		{maxI, maxI, maxI, maxI, maxI, maxI, 1000, 1000, "120", "", 0, flagRetryAfter | flagJoin1 | flagJoin2, 0},
		{maxI, maxI, maxI, day, maxI, maxI, 10, 10, "99999999999999999999", "", 0, flagRetryAfter | flagFarDeadline, maxI},
		{maxI, 0, maxI, day, 0, maxI, 10, 10, "9223372036", "", 0, flagRetryAfter | flagJoin1, day + sec},
		{0, 1, 0, 1, 1, 1, 1, 2, "1", "", 0, flagRetryAfter | flagJoin2, 0},
		{1, 1, 1, 1, 1, sec, 1, 1, "0", "1", 0, flagRetryAfter | flagRespCL | flagJoin1, 3},
		{-1, 0, 0, day, 0, sec, 0, 0, "", "", 0, 0, 0},
		{minI, minI, minI, minI, minI, minI, 5, 5, "", "", 0, 0, 0},
		{0, 0, -1, day, 0, sec, 0, 0, "", "", 0, 0, 0},
		{1 << 20, 1 << 20, 0, 0, 0, sec, 0, 0, "", "", 0, 0, 0},
		{1 << 20, 1 << 20, 0, day, -1, 0, 0, 0, "", "", 0, 0, 0},
		{100, 50, maxI, maxI, maxI, maxI, 100, 60000, "Wed, 21 Oct 2015 07:28:00 GMT", "", 0,
			flagRetryAfter | flagJoin1 | flagJoin2 | flagNamed, 0},
		{100, maxI, maxI, int64(time.Hour), int64(time.Hour), maxI, 100, 50, "Sun, 06 Nov 2095 08:49:37 GMT", "", 0,
			flagRetryAfter | flagFarDeadline | flagGetBody, int64(2 * time.Hour)},
		{1000, maxI, 0, day, 0, maxI, 500, 40, "", "41", 499, flagRespCL | flagReqCL | flagJoin1, 0},
		{1000, maxI, 0, day, 0, maxI, 500, 40, "", "39", 501, flagRespCL | flagReqCL | flagGetBody | flagJoin2, 0},
		{1000, maxI, 0, day, 0, maxI, 500, 40, "", "x", -7, flagRespCL | flagReqCL | flagNamed, 0},
		{99, maxI, 0, day, 0, maxI, 100, 40, "", "", 0, flagJoin1, 0},
	} {
		f.Add(in.maxBuffered, in.maxShared, in.maxRetryAfter, in.keyWindow, in.settle, in.journalTimeout,
			in.bodyLen, in.respLen, in.retryAfter, in.respCL, in.reqCL, in.flags, in.advance)
	}

	srv := &fuzzServer{runs: map[string]*fuzzRun{}}
	hs := httptest.NewServer(srv)
	f.Cleanup(hs.Close)
	srv.url = hs.URL
	base := &http.Transport{}
	f.Cleanup(base.CloseIdleConnections)

	f.Fuzz(func(t *testing.T, maxBuffered, maxShared, maxRetryAfter, keyWindow, settle, journalTimeout int64,
		bodyLen, respLen uint16, retryAfter, respCL string, reqCL int64, flags uint8, advance int64) {
		clk := newFakeClock()
		j := &ctxJournal{Memory: journal.NewMemory()}
		tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk),
			idemretry.WithBackOff(constant(0)),
			idemretry.WithMaxBufferedBody(maxBuffered), idemretry.WithMaxSharedResponse(maxShared),
			idemretry.WithMaxRetryAfter(time.Duration(maxRetryAfter)), idemretry.WithKeyWindow(time.Duration(keyWindow)),
			idemretry.WithSettleTime(time.Duration(settle)), idemretry.WithJournalTimeout(time.Duration(journalTimeout)))
		invalid := maxBuffered < 0 || maxShared < 0 || maxRetryAfter < 0 || keyWindow <= 0 || settle < 0 || journalTimeout <= 0
		if invalid {
			if !errors.Is(err, idemretry.ErrInvalidOption) {
				t.Fatalf("NewTransport: %v, want ErrInvalidOption", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("NewTransport with valid options: %v", err)
		}
		defer func() {
			// Close writes the outcomes the journal could not take: it
			// may fail too with a journal timeout too short for it.
			if err := tr.Close(); err != nil && journalTimeout >= sec {
				t.Errorf("Close: %v", err)
			}
			checkNoPackageGoroutines(t)
		}()

		joiners := 0
		if flags&flagJoin1 != 0 {
			joiners++
		}
		if flags&flagJoin2 != 0 {
			joiners += 2
		}
		sendRA := flags&flagRetryAfter != 0 && fuzzHeaderValue(retryAfter)
		setRespCL := flags&flagRespCL != 0 && fuzzHeaderValue(respCL) && respCL != ""
		url, run := srv.newRun(joiners > 0)
		body := strings.Repeat("b", int(bodyLen))
		want := fuzzPattern(int(respLen))
		started := clk.Now()
		// Only the leader carries the far deadline. (Two callers joining a
		// flight whose leader left for its own deadline once made a new
		// payment of an unnamed action; its joiners are now bound to the
		// action the leader reserved.)
		newReq := func(leader bool) *http.Request {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if flags&flagFarDeadline != 0 && leader {
				ctx, cancel = context.WithTimeout(ctx, math.MaxInt64)
			}
			t.Cleanup(cancel)
			if flags&flagNamed != 0 {
				ctx = idemretry.WithAction(ctx, "pay:fuzz")
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if flags&flagGetBody == 0 {
				req.Body, req.GetBody = noGetBody(body), nil
			}
			if flags&flagReqCL != 0 {
				req.ContentLength = reqCL
			}
			req.Header.Set("X-Fuzz-Len", fmt.Sprint(respLen))
			if sendRA {
				req.Header["X-Fuzz-Retry-After"] = []string{retryAfter}
			}
			if setRespCL {
				req.Header["X-Fuzz-Cl"] = []string{respCL}
			}
			return req
		}
		type outcome struct {
			status int
			body   string
			rerr   error // reading the body
			err    error
			giveUp error
		}
		call := func(leader bool) outcome {
			resp, err := tr.RoundTrip(newReq(leader))
			if err != nil {
				return outcome{err: err}
			}
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			return outcome{status: resp.StatusCode, body: string(b), rerr: rerr, giveUp: idemretry.GiveUpReason(resp)}
		}

		leaderDone := make(chan outcome, 1)
		go func() { leaderDone <- call(true) }()
		outs := make(chan outcome, joiners)
		if joiners > 0 {
			var leader outcome
			select {
			case <-run.arrived:
			case leader = <-leaderDone: // refused before sending
				leaderDone <- leader
			}
			for range joiners {
				go func() { outs <- call(false) }()
			}
			deadline := time.Now().Add(liveness)
			for strings.Count(goroutineStacks(), "(*flights).wait") < joiners && len(outs) < joiners && len(leaderDone) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d callers did not join the flight", joiners)
				}
				time.Sleep(time.Millisecond)
			}
			close(run.release)
		}
		leader := <-leaderDone
		var joined []outcome
		for range joiners {
			joined = append(joined, <-outs)
		}
		reqs, lens := run.requests()

		// Refused before anything was sent.
		if flags&flagGetBody == 0 && int64(bodyLen) > maxBuffered {
			for _, o := range append([]outcome{leader}, joined...) {
				if !errors.Is(o.err, idemretry.ErrBodyTooLarge) {
					t.Fatalf("a %d-byte body over WithMaxBufferedBody(%d): %+v, want ErrBodyTooLarge", bodyLen, maxBuffered, o)
				}
			}
			if len(reqs) != 0 {
				t.Fatalf("%d requests sent of a body refused", len(reqs))
			}
			return
		}
		if errors.Is(leader.err, journal.ErrUnavailable) && journalTimeout < sec {
			return // a journal timeout too short for the journal: nothing more is promised
		}
		validReqCL := flags&flagReqCL == 0 || reqCL == int64(bodyLen) || reqCL == -1 || (reqCL == 0 && bodyLen > 0)
		if len(reqs) == 0 && validReqCL {
			t.Fatalf("nothing sent: leader %+v (%v)", leader, leader.err)
		}
		for i, r := range reqs {
			if r.Key == "" || r.Key != reqs[0].Key {
				t.Fatalf("request %d carried key %q, the first %q: one action, one key", i+1, r.Key, reqs[0].Key)
			}
		}
		if validReqCL {
			for i, r := range reqs {
				if r.BodyHash != sha256.Sum256([]byte(body)) {
					t.Fatalf("request %d: the server got %d bytes of the %d-byte body (buffer limit %d)", i+1, lens[i], bodyLen, maxBuffered)
				}
			}
		} else {
			return // net/http refuses a body whose length is not its ContentLength: nothing more is promised
		}

		if validRespCL := !setRespCL || respCL == fmt.Sprint(respLen); !validRespCL {
			// An answer whose Content-Length is not its length fails to
			// read (and is retried as a network error): only what the
			// callers got is checked.
			for i, o := range append([]outcome{leader}, joined...) {
				if o.err == nil && !strings.HasPrefix(want, o.body) {
					t.Fatalf("caller %d got bytes the server did not send", i+1)
				}
			}
			return
		}

		// Retry-After.
		ra, raOK := time.Duration(0), false
		if sendRA {
			ra, raOK = idemretry.RetryAfter(&http.Response{StatusCode: http.StatusServiceUnavailable,
				Header: http.Header{"Retry-After": {retryAfter}}}, started)
		}
		waits := clk.Waits()
		nearMax := flags&flagFarDeadline != 0 && ra >= math.MaxInt64-time.Minute // the deadline may come first
		switch {
		case raOK && ra > time.Duration(maxRetryAfter):
			if leader.status != http.StatusServiceUnavailable || !errors.Is(leader.giveUp, idemretry.ErrRetryAfterTooLong) {
				t.Fatalf("Retry-After %v over the cap %v: %+v, want the 503 with ErrRetryAfterTooLong", ra, time.Duration(maxRetryAfter), leader)
			}
		case raOK && nearMax && errors.Is(leader.giveUp, idemretry.ErrWaitExceedsDeadline):
		case raOK && ra >= time.Duration(keyWindow):
			if !errors.Is(leader.err, idemretry.ErrKeyWindowExpired) {
				t.Fatalf("Retry-After %v, key window %v: %+v, want ErrKeyWindowExpired", ra, time.Duration(keyWindow), leader)
			}
		case !sendRA:
			if len(reqs) != 1 || leader.status != http.StatusCreated {
				t.Fatalf("answered 201 at once: %d requests, %+v", len(reqs), leader)
			}
		default:
			if len(reqs) != 2 || leader.status != http.StatusCreated {
				t.Fatalf("Retry-After %q (%v, %v) within the cap %v and the window %v: %d requests, %+v; want the retry's 201",
					retryAfter, ra, raOK, time.Duration(maxRetryAfter), time.Duration(keyWindow), len(reqs), leader)
			}
			if raOK && ra > 0 && (len(waits) != 1 || waits[0] != ra) {
				t.Fatalf("Retry-After %v: waited %v", ra, waits)
			}
		}
		if len(reqs) == 1 && len(waits) != 0 {
			t.Fatalf("no retry, yet waited %v", waits)
		}

		if leader.status == http.StatusCreated {
			if leader.rerr != nil || leader.body != want {
				t.Fatalf("the leader's answer: %d of %d bytes, %v", len(leader.body), respLen, leader.rerr)
			}
			for i, o := range joined {
				switch {
				case int64(respLen) > maxShared:
					if !errors.Is(o.err, idemretry.ErrResponseNotShared) {
						t.Fatalf("a %d-byte answer over WithMaxSharedResponse(%d): caller %d got %+v, want ErrResponseNotShared", respLen, maxShared, i+2, o)
					}
				case o.err != nil || o.status != http.StatusCreated || o.body != want:
					t.Fatalf("a %d-byte answer within WithMaxSharedResponse(%d): caller %d got %d bytes, %+v", respLen, maxShared, i+2, len(o.body), o)
				}
			}
			if journalTimeout >= sec {
				left, err := j.Unfinished(context.Background())
				if err != nil || len(left) != 0 {
					t.Fatalf("answered, yet the journal lists %v (%v)", left, err)
				}
			}
		}

		// Settle time: an outcome-unknown action goes to Resolve exactly
		// when its window and settle time have passed.
		if errors.Is(leader.err, idemretry.ErrKeyWindowExpired) {
			clk.Advance(time.Duration(max(advance, 0)))
			settled := keyWindow + settle
			if settled < keyWindow {
				settled = math.MaxInt64
			}
			due := !clk.Now().Before(started.Add(time.Duration(settled)))
			r := &resolveRecorder{}
			res, err := tr.Resume(context.Background(), r, 1)
			if err != nil || len(res) != 1 {
				t.Fatalf("Resume: %v, %v", res, err)
			}
			if asked := len(r.asked) == 1; asked != due {
				t.Fatalf("window %v + settle %v, %v after the key: Resolve asked %v, want %v (%v)",
					time.Duration(keyWindow), time.Duration(settle), clk.Now().Sub(started), asked, due, res[0].Err)
			}
		}
	})
}
