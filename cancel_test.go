package idemretry_test

// Request.Cancel (deprecated, still honoured by net/http and set by every
// http.Client with a Timeout) is the caller's own cancellation, as its
// context's end is: no retry, no budget spent, and every wait on the
// request path (between attempts, in a flight, reading the answer) ends
// with it. Issue 26, item 5.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// postCancel is post with a Cancel channel, which it returns with a
// function that closes it (once).
func postCancel(t *testing.T, ctx context.Context, url, body string) (*http.Request, func()) {
	t.Helper()
	req := post(t, ctx, url, body)
	ch := make(chan struct{})
	req.Cancel = ch //lint:ignore SA1019 what is tested
	var once sync.Once
	return req, func() { once.Do(func() { close(ch) }) }
}

// rtResult is what a RoundTrip run by goRoundTrip returned.
type rtResult struct {
	resp *http.Response
	err  error
}

// goRoundTrip runs tr.RoundTrip(req) on a goroutine of its own; the
// channel gives what it returned, with the body read and closed.
func goRoundTrip(tr http.RoundTripper, req *http.Request) <-chan rtResult {
	done := make(chan rtResult, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- rtResult{resp, err}
	}()
	return done
}

// awaitResult returns what done gives, or fails the test if nothing comes
// within liveness.
func awaitResult(t *testing.T, done <-chan rtResult, what string) rtResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(liveness):
		t.Fatalf("%s: RoundTrip had not returned %v after its Cancel closed", what, liveness)
		return rtResult{}
	}
}

// heldClock is the real clock whose timers never fire: a wait between
// attempts ends only with the caller. Each wait that starts is told on
// started.
type heldClock struct{ started chan time.Duration }

func (heldClock) Now() time.Time              { return time.Now() }
func (c heldClock) NewTimer() idemretry.Timer { return &heldTimer{c: c} }

type heldTimer struct{ c heldClock }

func (t *heldTimer) Start(d time.Duration) { t.c.started <- d }
func (t *heldTimer) Stop()                 {}
func (t *heldTimer) C() <-chan time.Time   { return nil }

// A Cancel that closes while an attempt is in the air ends the action
// there: the attempt's failure is the caller's doing, not the network's.
// Before: retried 5 times (ErrAttemptsExhausted, 5 budget tokens spent).
func TestRequestCancelIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.arrived = make(chan int, 10)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done() // every attempt is held until the client gives up on it
		return true
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)))
	req, cancel := postCancel(t, idemretry.WithAction(context.Background(), "pay:cancel-1"), srv.URL, `{"amount":1}`)
	done := goRoundTrip(tr, req)
	<-srv.arrived
	cancel()
	r := awaitResult(t, done, "an attempt in the air")

	require.Error(t, r.err)
	require.ErrorIs(t, r.err, context.Canceled)
	require.NotErrorIs(t, r.err, idemretry.ErrAttemptsExhausted)
	var ae *idemretry.ActionError
	require.ErrorAs(t, r.err, &ae)
	require.Nil(t, ae.Reason, "the caller's own end, not a give-up")
	st := tr.Stats()
	require.Zero(t, st.Retries, "no retry after the caller cancelled")
	require.Len(t, srv.seen(), 1, "one attempt reached the server")

	// The action is left pending with its key: the app's resend carries it.
	srv.script = nil
	resp := roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:cancel-1"), srv.URL, `{"amount":1}`))
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	reqs := srv.seen()
	require.Equal(t, reqs[0].Key, reqs[len(reqs)-1].Key, "the resend carries the cancelled attempt's key")
}

// A Cancel that closes during the wait between attempts ends the wait.
func TestRequestCancelEndsTheWaitBetweenAttempts(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = scriptFirst(status(http.StatusServiceUnavailable))
	clk := heldClock{started: make(chan time.Duration, 10)}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithClock(clk))
	req, cancel := postCancel(t, context.Background(), srv.URL, `{"amount":2}`)
	done := goRoundTrip(tr, req)
	<-clk.started // the 503 came; the Transport waits to retry
	cancel()
	r := awaitResult(t, done, "waiting between attempts")
	require.ErrorIs(t, r.err, context.Canceled)
	require.Len(t, srv.seen(), 1, "no attempt after the cancel")
}

// A caller that joined another's flight and cancels stops waiting for it;
// the flight goes on for its leader.
func TestRequestCancelEndsAJoinersWait(t *testing.T) {
	srv := newPayServer(t)
	srv.arrived = make(chan int, 10)
	arrived, unblock := slowFirstCharge(t, srv)
	tr := transportOver(t, journal.NewMemory())
	const body = `{"amount":3}`
	leader := goRoundTrip(tr, post(t, context.Background(), srv.URL, body))
	<-arrived
	req, cancel := postCancel(t, context.Background(), srv.URL, body)
	joiner := goRoundTrip(tr, req)
	require.Eventually(t, func() bool { return strings.Contains(goroutineStacks(), "(*flights).wait") },
		liveness, 5*time.Millisecond, "the double tap joins the flight")
	cancel()
	r := awaitResult(t, joiner, "a joiner")
	require.ErrorIs(t, r.err, context.Canceled)

	unblock()
	l := awaitResult(t, leader, "the leader")
	require.NoError(t, l.err)
	require.Equal(t, http.StatusCreated, l.resp.StatusCode)
	srv.requireOnePayment(t, 1)
}

// A leader whose Cancel closes hands its flight to the caller that joined
// it, which carries the action on under the same key: one charge.
func TestRequestCancelOfALeaderHandsItsFlightOn(t *testing.T) {
	srv := newPayServer(t)
	srv.arrived = make(chan int, 10)
	arrived, unblock := slowFirstCharge(t, srv)
	tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)))
	const body = `{"amount":4}`
	req, cancel := postCancel(t, context.Background(), srv.URL, body)
	leader := goRoundTrip(tr, req)
	<-arrived
	joiner := goRoundTrip(tr, post(t, context.Background(), srv.URL, body))
	require.Eventually(t, func() bool { return strings.Contains(goroutineStacks(), "(*flights).wait") },
		liveness, 5*time.Millisecond, "the double tap joins the flight")
	cancel()
	l := awaitResult(t, leader, "the leader")
	require.ErrorIs(t, l.err, context.Canceled)
	unblock()
	j := awaitResult(t, joiner, "the joiner")
	require.NoError(t, j.err)
	require.Equal(t, http.StatusCreated, j.resp.StatusCode)
	reqs := srv.seen()
	require.Equal(t, 1, srv.chargeCount())
	for _, r := range reqs {
		require.Equal(t, reqs[0].Key, r.Key, "one key for the action")
	}
}

// A Cancel that closes while the caller reads the answer's body cuts the
// read, as net/http does; one that never closes holds nothing once the
// body is read to its end or closed, or when RoundTrip fails.
func TestRequestCancelWatchEndsWithTheAnswer(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/stall":
			stallBody(w, r, http.StatusCreated, `{"charge":`, release)
		case "/refused":
			w.WriteHeader(http.StatusBadRequest)
		default:
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"charge":"ch_1"}`)
		}
	})
	tr, _, _ := newTestTransport(t) // checks at cleanup that no goroutine of the package is left

	t.Run("cancel during the body", func(t *testing.T) {
		req, cancel := postCancel(t, context.Background(), srv.URL+"/stall", `{"amount":5}`)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		buf := make([]byte, 10)
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		cancel()
		_, err = io.ReadAll(resp.Body)
		require.Error(t, err, "the read is cut by the cancel")
	})
	t.Run("never cancelled", func(t *testing.T) {
		for i := range 10 {
			req, _ := postCancel(t, context.Background(), srv.URL+"/ok", `{"amount":6,"i":`+string(rune('0'+i))+`}`)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body) // read to its end, not closed
			require.NoError(t, err)
			req, _ = postCancel(t, context.Background(), srv.URL+"/ok", `{"amount":7,"i":`+string(rune('0'+i))+`}`)
			resp, err = tr.RoundTrip(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close()) // closed, not read
			req, _ = postCancel(t, context.Background(), srv.URL+"/refused", `{"amount":8}`)
			resp, err = tr.RoundTrip(req)
			require.NoError(t, err)
			readAll(t, resp)
		}
		req, _ := postCancel(t, context.Background(), "http://"+closedAddr(t)+"/", `{"amount":9}`)
		_, err := tr.RoundTrip(req)
		require.Error(t, err)
		require.False(t, errors.Is(err, context.Canceled), "a refused dial is not a cancel: %v", err)
	})
}

// A request body without GetBody is read into memory before anything is
// reserved; one that stalls (a pipe whose writer never writes) must not
// hold RoundTrip past the caller's context, nor past its Request.Cancel.
// net/http itself waits for such a body (golang/go#78555). Found in review2.
func TestStalledRequestBodyEndsWithTheCaller(t *testing.T) {
	for _, how := range []string{"deadline", "Request.Cancel"} {
		t.Run(how, func(t *testing.T) {
			srv := newPayServer(t)
			tr, j, _ := newTestTransport(t)
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.Close() })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if how == "deadline" {
				ctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
			}
			req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, "pay:stalled-body"), http.MethodPost, srv.URL+"/v1/charges", pr)
			require.NoError(t, err)
			require.Nil(t, req.GetBody)
			if how == "Request.Cancel" {
				ch := make(chan struct{})
				req.Cancel = ch //lint:ignore SA1019 what is tested
				time.AfterFunc(100*time.Millisecond, func() { close(ch) })
			}
			r := awaitResult(t, goRoundTrip(tr, req), how)
			require.Error(t, r.err)
			require.Truef(t, errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled), "%v: want the caller's end", r.err)
			require.Zero(t, srv.chargeCount(), "nothing was sent")
			recs, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Empty(t, recs, "nothing was reserved")
		})
	}
}

// A Cancel that closes as a retryable answer arrives ends the action at
// once, whatever the clock: the next attempt checks the caller's context,
// and that context ends with the channel, not when the watch on it is next
// scheduled. Found by the lifecycle simulator (a joiner carrying a flight
// on, cancelled as a 409 came, made 3 more requests); before: with timers
// that fire at once, retried up to WithMaxRetries times.
func TestRequestCancelAsTheAnswerComesIsNotRetried(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusConflict) // still in progress: retried
		return true
	}
	var cancel func()
	real := &http.Transport{}
	t.Cleanup(real.CloseIdleConnections)
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := real.RoundTrip(r)
		cancel() // the caller gives up as the answer comes
		return resp, err
	})
	tr, err := idemretry.NewTransport(base, inMemory(), idemretry.WithClock(newFakeClock()), idemretry.WithMaxRetries(5))
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	const rounds = 20
	for i := range rounds {
		var req *http.Request
		req, cancel = postCancel(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:cancel-answer-%d", i)), srv.URL, `{"amount":9}`)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			readAll(t, resp)
		}
	}
	require.Equal(t, rounds, len(srv.seen()), "one request per action: none after its caller's Cancel closed")
	require.Zero(t, tr.Stats().Retries, "no retry after the caller cancelled")
}

// A GetBody copy that stalls as the fingerprint reads it (a pipe whose
// writer never writes) ends with the caller, as a stalled Body does
// (TestStalledRequestBodyEndsWithTheCaller): before, RoundTrip waited for
// it past the caller's deadline and Request.Cancel.
func TestStalledGetBodyCopyEndsWithTheCaller(t *testing.T) {
	for _, how := range []string{"deadline", "Request.Cancel"} {
		t.Run(how, func(t *testing.T) {
			srv := newPayServer(t)
			tr, j, _ := newTestTransport(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if how == "deadline" {
				ctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
			require.NoError(t, err)
			var pws []*io.PipeWriter
			var mu sync.Mutex
			t.Cleanup(func() {
				mu.Lock()
				defer mu.Unlock()
				for _, pw := range pws {
					pw.Close()
				}
			})
			req.GetBody = func() (io.ReadCloser, error) {
				pr, pw := io.Pipe()
				mu.Lock()
				pws = append(pws, pw)
				mu.Unlock()
				return pr, nil
			}
			if how == "Request.Cancel" {
				ch := make(chan struct{})
				req.Cancel = ch //lint:ignore SA1019 what is tested
				time.AfterFunc(100*time.Millisecond, func() { close(ch) })
			}
			r := awaitResult(t, goRoundTrip(tr, req), how)
			require.Error(t, r.err)
			require.Truef(t, errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled), "%v: want the caller's end", r.err)
			require.Zero(t, len(srv.pay.Requests()), "nothing was sent")
			recs, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Empty(t, recs, "nothing was reserved")
		})
	}
}
