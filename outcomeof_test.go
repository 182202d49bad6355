package idemretry_test

// OutcomeOf over every shape a RoundTrip (or http.Client.Do over a
// Transport) returns, each produced over loopback HTTP.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// outcomeShape is one result of a request, and what OutcomeOf must make of
// it: its Kind, Replayed, Action, Status and MaybeProcessed as given, its
// Key the one the server saw (or the journal holds), its Attempts as
// given (or, with attemptsSeen, the requests the server saw), and a Reason
// that is wantReason (errors.Is; nil: none).
type outcomeShape struct {
	name         string
	run          func(t *testing.T) shapeResult
	want         idemretry.Outcome
	wantReason   error
	attemptsSeen bool
}

// shapeResult is what a shape's request returned, the key it went out
// under ("" if none), and how many requests the server saw.
type shapeResult struct {
	resp *http.Response
	err  error
	key  string
	seen int
}

func TestOutcomeOfEveryShape(t *testing.T) {
	const action = "pay:order-1"
	fast := []idemretry.Option{idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2)}
	named := func(ctx context.Context) context.Context { return idemretry.WithAction(ctx, action) }
	// pay sends one payment of action through tr to url and returns what
	// came back, with the key of the action's record in j.
	pay := func(t *testing.T, tr http.RoundTripper, j journal.Journal, ctx context.Context, url, body string) shapeResult {
		resp, err := tr.RoundTrip(post(t, named(ctx), url, body))
		return shapeResult{resp: resp, err: err, key: keyOf(t, j, action)}
	}
	statusServer := func(t *testing.T, code int, body string) *payServer {
		srv := newPayServer(t)
		srv.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, body)
			return true
		}
		return srv
	}
	withSeen := func(r shapeResult, srv *payServer) shapeResult { r.seen = len(srv.seen()); return r }

	shapes := []outcomeShape{
		{name: "final 201", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			return pay(t, transportOver(t, j, fast...), j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 201, MaybeProcessed: true}},

		{name: "replay", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			tr := transportOver(t, j, fast...)
			readAll(t, pay(t, tr, j, context.Background(), srv.URL, `{"amount":1}`).resp)
			return pay(t, tr, j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Done, Replayed: true, Action: action, Attempts: 2, Status: 201, MaybeProcessed: true}},

		{name: "final 400", run: func(t *testing.T) shapeResult {
			srv, j := statusServer(t, http.StatusBadRequest, `{"error":"amount"}`), journal.NewMemory()
			return pay(t, transportOver(t, j, fast...), j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 400, MaybeProcessed: true}},

		{name: "final 422", run: func(t *testing.T) shapeResult {
			srv, j := statusServer(t, http.StatusUnprocessableEntity, `{"error":"card declined"}`), journal.NewMemory()
			return pay(t, transportOver(t, j, fast...), j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 422, MaybeProcessed: true}},

		{name: "gave up on 503 with a nil error", run: func(t *testing.T) shapeResult {
			srv, j := statusServer(t, http.StatusServiceUnavailable, `{}`), journal.NewMemory()
			r := pay(t, transportOver(t, j, fast...), j, context.Background(), srv.URL, `{"amount":1}`)
			require.NoError(t, r.err)
			return r
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Action: action, Attempts: 3, Status: 503, MaybeProcessed: true},
			wantReason: idemretry.ErrAttemptsExhausted},

		{name: "network error after the request was written", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			srv.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool { hijackAndClose(w); return true }
			return withSeen(pay(t, transportOver(t, j, fast...), j, context.Background(), srv.URL, `{"amount":1}`), srv)
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Action: action, MaybeProcessed: true},
			wantReason: idemretry.ErrAttemptsExhausted, attemptsSeen: true},

		{name: "every dial refused", run: func(t *testing.T) shapeResult {
			j := journal.NewMemory()
			return pay(t, transportOver(t, j, fast...), j, context.Background(), "http://"+closedAddr(t)+"/", `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.NotSent, Action: action, Attempts: 3},
			wantReason: idemretry.ErrAttemptsExhausted},

		{name: "parked by the retry budget", run: func(t *testing.T) shapeResult {
			srv, j := statusServer(t, http.StatusServiceUnavailable, `{}`), journal.NewMemory()
			tr := transportOver(t, j, idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(5), idemretry.WithRetryBudget(1, 0))
			return pay(t, tr, j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Action: action, Attempts: 2, Status: 503, MaybeProcessed: true},
			wantReason: idemretry.ErrParked},

		{name: "deadline passed before the request", run: func(t *testing.T) shapeResult {
			// The journal is not asked about the action: an earlier run
			// may have sent it.
			srv, j := newPayServer(t), journal.NewMemory()
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel()
			return withSeen(pay(t, transportOver(t, j, fast...), j, ctx, srv.URL, `{"amount":1}`), srv)
		}, want: idemretry.Outcome{Kind: idemretry.Pending, MaybeProcessed: true},
			wantReason: context.DeadlineExceeded, attemptsSeen: true},

		{name: "request's context ended after its key was reserved, before sending", run: func(t *testing.T) shapeResult {
			srv := newPayServer(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			j := &cancelOnReserve{Memory: journal.NewMemory(), cancel: cancel}
			return withSeen(pay(t, transportOver(t, j, fast...), j, ctx, srv.URL, `{"amount":1}`), srv)
		}, want: idemretry.Outcome{Kind: idemretry.NotSent, Action: action},
			wantReason: context.Canceled, attemptsSeen: true},

		{name: "deadline after sending", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			srv.script = func(_ int, _ http.ResponseWriter, r *http.Request) bool { <-r.Context().Done(); return true }
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			return pay(t, transportOver(t, j, fast...), j, ctx, srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Action: action, Attempts: 1, MaybeProcessed: true},
			wantReason: context.DeadlineExceeded},

		{name: "request's context cancelled while it is at the server", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			srv.script = func(_ int, _ http.ResponseWriter, r *http.Request) bool { cancel(); <-r.Context().Done(); return true }
			return pay(t, transportOver(t, j, fast...), j, ctx, srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Action: action, Attempts: 1, MaybeProcessed: true},
			wantReason: context.Canceled},

		{name: "ErrFingerprintMismatch", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			tr := transportOver(t, j, fast...)
			readAll(t, pay(t, tr, j, context.Background(), srv.URL, `{"amount":1}`).resp)
			return pay(t, tr, j, context.Background(), srv.URL, `{"amount":2}`)
		}, want: idemretry.Outcome{Kind: idemretry.Refused, Action: action, Attempts: 1, Status: 201, MaybeProcessed: true},
			wantReason: idemretry.ErrFingerprintMismatch},

		{name: "ErrKeyWindowExpired", run: func(t *testing.T) shapeResult {
			srv := newPayServer(t)
			srv.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool { hijackAndClose(w); return true }
			tr, j, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
			_, err := tr.RoundTrip(post(t, named(context.Background()), srv.URL, `{"amount":1}`))
			require.Error(t, err)
			clk.Advance(idemretry.DefaultKeyWindow + time.Minute)
			return pay(t, tr, j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Refused, Action: action, Attempts: 1, MaybeProcessed: true},
			wantReason: idemretry.ErrKeyWindowExpired},

		{name: "ErrKeyReused", run: func(t *testing.T) shapeResult {
			srv, j := statusServer(t, http.StatusConflict, `{"code":"idempotency_key_reused"}`), journal.NewMemory()
			return pay(t, transportOver(t, j, fast...), j, context.Background(), srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Refused, Action: action, Attempts: 1, Status: 409, MaybeProcessed: true},
			wantReason: idemretry.ErrKeyReused},

		{name: "ErrActionRequired", run: func(t *testing.T) shapeResult {
			srv := newPayServer(t)
			tr := transportOver(t, journal.NewMemory(), append(fast, idemretry.WithRequireAction())...)
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
			return shapeResult{resp: resp, err: err}
		}, want: idemretry.Outcome{Kind: idemretry.Refused}, wantReason: idemretry.ErrActionRequired},

		{name: "journal closed", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			tr := transportOver(t, j, fast...)
			require.NoError(t, j.Close())
			resp, err := tr.RoundTrip(post(t, named(context.Background()), srv.URL, `{"amount":1}`))
			return shapeResult{resp: resp, err: err}
		}, want: idemretry.Outcome{Kind: idemretry.Refused, MaybeProcessed: true}, wantReason: journal.ErrClosed},

		{name: "ErrResponseNotShared, to a caller that joined the flight", run: func(t *testing.T) shapeResult {
			srv, j := newSlowPayServer(t, 300*time.Millisecond), journal.NewMemory()
			tr := transportOver(t, j, append(fast, idemretry.WithMaxSharedResponse(4))...)
			results := joinOneFlight(t, srv, tr, named(context.Background()), `{"amount":1}`)
			require.NoError(t, results[0].err)
			readAll(t, results[0].resp)
			return shapeResult{resp: results[1].resp, err: results[1].err, key: keyOf(t, j, action)}
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Action: action, Attempts: 1, Status: 201, MaybeProcessed: true},
			wantReason: idemretry.ErrResponseNotShared},

		{name: "a copy of the answer, to a caller that joined the flight", run: func(t *testing.T) shapeResult {
			srv, j := newSlowPayServer(t, 300*time.Millisecond), journal.NewMemory()
			tr := transportOver(t, j, fast...)
			results := joinOneFlight(t, srv, tr, named(context.Background()), `{"amount":1}`)
			require.NoError(t, results[0].err)
			require.NoError(t, results[1].err)
			readAll(t, results[0].resp)
			return shapeResult{resp: results[1].resp, key: keyOf(t, j, action)}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 201, MaybeProcessed: true}},

		{name: "through an http.Client with a Timeout", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			c := &http.Client{Transport: transportOver(t, j, fast...), Timeout: time.Minute}
			resp, err := c.Do(post(t, named(context.Background()), srv.URL, `{"amount":1}`))
			return shapeResult{resp: resp, err: err, key: keyOf(t, j, action)}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 201, MaybeProcessed: true}},

		{name: "under a caller's httptrace", run: func(t *testing.T) shapeResult {
			srv, j := newPayServer(t), journal.NewMemory()
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) {}})
			return pay(t, transportOver(t, j, fast...), j, ctx, srv.URL, `{"amount":1}`)
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 201, MaybeProcessed: true}},

		{name: "an error the caller wrapped", run: func(t *testing.T) shapeResult {
			j := journal.NewMemory()
			r := pay(t, transportOver(t, j, fast...), j, context.Background(), "http://"+closedAddr(t)+"/", `{"amount":1}`)
			r.err = fmt.Errorf("checkout: %w", r.err)
			return r
		}, want: idemretry.Outcome{Kind: idemretry.NotSent, Action: action, Attempts: 3},
			wantReason: idemretry.ErrAttemptsExhausted},

		{name: "a caller's own key", run: func(t *testing.T) shapeResult {
			srv := newPayServer(t)
			req := post(t, context.Background(), srv.URL, `{"amount":1}`)
			req.Header.Set("Idempotency-Key", "order-1-key")
			resp, err := transportOver(t, journal.NewMemory(), fast...).RoundTrip(req)
			return shapeResult{resp: resp, err: err, key: "order-1-key"}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: "key:order-1-key", Attempts: 1, Status: 201, MaybeProcessed: true}},

		{name: "a GET, sent without a key", run: func(t *testing.T) shapeResult {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
			resp, err := transportOver(t, journal.NewMemory(), fast...).RoundTrip(httptestGet(t, srv.URL))
			return shapeResult{resp: resp, err: err}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Status: 200, MaybeProcessed: true}},

		{name: "a 303 followed to its receipt", run: func(t *testing.T) shapeResult {
			srv, j := receiptServer(t, ""), journal.NewMemory()
			c := &http.Client{Transport: transportOver(t, j, fast...)}
			resp, err := c.Do(post(t, named(context.Background()), srv.URL+"/pay", `{"amount":1}`))
			return shapeResult{resp: resp, err: err, key: keyOf(t, j, action)}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 200, MaybeProcessed: true}},

		{name: "a 303 whose receipt cannot be fetched", run: func(t *testing.T) shapeResult {
			srv, j := receiptServer(t, "http://"+closedAddr(t)+"/receipt"), journal.NewMemory()
			c := &http.Client{Transport: transportOver(t, j, fast...)}
			resp, err := c.Do(post(t, named(context.Background()), srv.URL+"/pay", `{"amount":1}`))
			return shapeResult{resp: resp, err: err}
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Attempts: 3, MaybeProcessed: true},
			wantReason: idemretry.ErrAttemptsExhausted},

		{name: "a 303 that CheckRedirect refuses", run: func(t *testing.T) shapeResult {
			srv, j := receiptServer(t, ""), journal.NewMemory()
			c := &http.Client{Transport: transportOver(t, j, fast...),
				CheckRedirect: func(*http.Request, []*http.Request) error { return errStopRedirect }}
			resp, err := c.Do(post(t, named(context.Background()), srv.URL+"/pay", `{"amount":1}`))
			require.Error(t, err)
			require.NotNil(t, resp)
			return shapeResult{resp: resp, err: err, key: keyOf(t, j, action)}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Action: action, Attempts: 1, Status: 303, MaybeProcessed: true},
			wantReason: errStopRedirect},

		{name: "a PUT through an http.Client, every dial refused", run: func(t *testing.T) shapeResult {
			// http.Client's *url.Error says "Put": no redirect followed.
			c := &http.Client{Transport: transportOver(t, journal.NewMemory(), fast...)}
			req, err := http.NewRequest(http.MethodPut, "http://"+closedAddr(t)+"/orders/1", strings.NewReader(`{"amount":1}`))
			require.NoError(t, err)
			resp, err := c.Do(req)
			return shapeResult{resp: resp, err: err}
		}, want: idemretry.Outcome{Kind: idemretry.NotSent, Attempts: 3}, wantReason: idemretry.ErrAttemptsExhausted},

		{name: "an unkeyed POST through an http.Client, its dial refused", run: func(t *testing.T) shapeResult {
			c := &http.Client{Transport: transportOver(t, journal.NewMemory(), append(fast, idemretry.WithUnkeyedMethods(http.MethodPost))...)}
			resp, err := c.Do(post(t, context.Background(), "http://"+closedAddr(t)+"/", `{"amount":1}`))
			return shapeResult{resp: resp, err: err}
		}, want: idemretry.Outcome{Kind: idemretry.NotSent, Attempts: 1}, wantReason: idemretry.ErrAttemptsExhausted},

		{name: "errors.Join of two actions' errors, one of them maybe paid", run: func(t *testing.T) shapeResult {
			srv := newPayServer(t)
			srv.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool { hijackAndClose(w); return true }
			tr := transportOver(t, journal.NewMemory(), fast...)
			_, notSent := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:order-2"), "http://"+closedAddr(t)+"/", `{"amount":2}`))
			_, maybe := tr.RoundTrip(post(t, named(context.Background()), srv.URL, `{"amount":1}`))
			require.Error(t, notSent)
			require.Error(t, maybe)
			return shapeResult{err: errors.Join(notSent, maybe)}
		}, want: idemretry.Outcome{Kind: idemretry.Pending, MaybeProcessed: true}, wantReason: errAny},

		{name: "a 503 the caller built, not from a Transport", run: func(t *testing.T) shapeResult {
			req := post(t, named(context.Background()), "http://"+closedAddr(t)+"/", `{"amount":1}`)
			return shapeResult{resp: &http.Response{StatusCode: http.StatusServiceUnavailable, Request: req, Body: http.NoBody}}
		}, want: idemretry.Outcome{Kind: idemretry.Pending, Status: 503, MaybeProcessed: true}, wantReason: errAny},

		{name: "a 201 the caller built, not from a Transport", run: func(t *testing.T) shapeResult {
			return shapeResult{resp: &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody}}
		}, want: idemretry.Outcome{Kind: idemretry.Done, Status: 201, MaybeProcessed: true}},

		{name: "neither a response nor an error", run: func(t *testing.T) shapeResult { return shapeResult{} },
			want: idemretry.Outcome{Kind: idemretry.Pending, MaybeProcessed: true}, wantReason: errAny},
	}
	for _, c := range shapes {
		t.Run(c.name, func(t *testing.T) {
			r := c.run(t)
			if r.resp != nil && r.resp.Body != nil {
				t.Cleanup(func() { r.resp.Body.Close() })
			}
			got := idemretry.OutcomeOf(r.resp, r.err)
			want := c.want
			want.Key = r.key
			if c.attemptsSeen {
				want.Attempts = r.seen
			}
			switch {
			case c.wantReason == nil:
				assert.NoError(t, got.Reason)
			case c.wantReason == errAny:
				assert.Error(t, got.Reason)
			default:
				assert.ErrorIs(t, got.Reason, c.wantReason)
			}
			want.Reason, got.Reason = nil, nil
			assert.Equal(t, want, got, "resp %v, err %v", statusOf(r.resp), r.err)
		})
	}
}

// cancelOnReserve is a journal whose Reserve ends the request's context
// once the key is reserved.
type cancelOnReserve struct {
	*journal.Memory
	cancel context.CancelFunc
}

func (j *cancelOnReserve) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	got, created, err := j.Memory.Reserve(ctx, rec, mode)
	j.cancel()
	return got, created, err
}

// errAny stands for any non-nil Reason; errStopRedirect is a CheckRedirect's.
var (
	errAny          = errors.New("any")
	errStopRedirect = errors.New("not following")
)

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// keyOf returns the key j holds for action id, or "".
func keyOf(t *testing.T, j journal.Journal, id string) string {
	t.Helper()
	recs, err := j.Unfinished(context.Background())
	if errors.Is(err, journal.ErrClosed) {
		return ""
	}
	require.NoError(t, err)
	for _, r := range recs {
		if r.ActionID == id {
			return r.Key
		}
	}
	if g, ok := j.(journal.Getter); ok {
		rec, found, err := g.Get(context.Background(), id)
		require.NoError(t, err)
		if found {
			return rec.Key
		}
	}
	return ""
}

// receiptServer answers a POST to /pay with 303 See Other to location
// (its own /receipt if ""), and a GET of /receipt with 200.
func receiptServer(t *testing.T, location string) *payServer {
	srv := newPayServer(t)
	srv.script = func(_ int, w http.ResponseWriter, r *http.Request) bool {
		switch r.URL.Path {
		case "/pay":
			loc := location
			if loc == "" {
				loc = "/receipt"
			}
			w.Header().Set("Location", loc)
			w.WriteHeader(http.StatusSeeOther)
		default:
			io.WriteString(w, `{"charge":"ch_1"}`)
		}
		return true
	}
	return srv
}

// joinOneFlight sends body as ctx's action through tr twice: the second
// while the first is at srv (a slow pay server), so that it joins the
// first's flight. It returns both results, the first's first.
func joinOneFlight(t *testing.T, srv *payServer, tr http.RoundTripper, ctx context.Context, body string) [2]shapeResult {
	var out [2]shapeResult
	var mu sync.Mutex
	i := 0
	leaderThenJoiners(srv, 2, func() {
		mu.Lock()
		n := i
		i++
		mu.Unlock()
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, body))
		out[n] = shapeResult{resp: resp, err: err}
	})
	require.Len(t, srv.seen(), 1, "the second request did not join the first's flight")
	return out
}

// A retrying base that sends its tries with requests of its own, without
// the attempt's context (so the Transport's trace never sees them
// written): its first try reaches the server, which charges and drops the
// connection; its retry, to a host that is down, is refused, and that dial
// error is what it returns. The Transport cannot tell from the error that
// nothing was written: only a base that looked up the attempt's trace has
// told it what it wrote. So the payment is Pending, never NotSent.
func TestOutcomeOfUnderABaseThatHidesItsTries(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	down := "http://" + closedAddr(t)
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		var err error
		for _, host := range []string{srv.URL, down} {
			body, gerr := r.GetBody()
			if gerr != nil {
				return nil, gerr
			}
			try, nerr := http.NewRequest(r.Method, host+r.URL.Path, body) // context.Background()
			if nerr != nil {
				return nil, nerr
			}
			try.Header = r.Header.Clone()
			var resp *http.Response
			if resp, err = http.DefaultTransport.RoundTrip(try); err == nil {
				return resp, nil
			}
		}
		return nil, err
	})
	tr, err := idemretry.NewTransport(base, inMemory(), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:hidden"), srv.URL+"/charges", `{"amount":1}`))
	require.Error(t, err)
	require.Equal(t, 1, srv.chargeCount(), "the first try was charged")
	o := idemretry.OutcomeOf(resp, err)
	assert.Equal(t, idemretry.Pending, o.Kind, "%v", err)
	assert.True(t, o.MaybeProcessed)
}
