package idemretry_test

// Regressions on the paths a real app takes by default (issue 7): an unnamed
// double tap, what was written, an answer that lands on the deadline, a
// journal that fails or hangs when the outcome is recorded, a key header
// spelled in lower case, a discarded body that stalls. Each runs over real
// loopback HTTP.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// The seeds' first story: the screen hangs, the customer taps again. Two
// identical POSTs with no action id and no key, the second sent while the
// first is in flight, are one payment: one request, one charge, and each
// caller reads the same answer. A third identical POST after both finished
// is a deliberate repeat: a new key and a second charge.
func TestUnnamedDoubleTapIsOnePayment(t *testing.T) {
	srv := newPayServer(t)
	srv.delay = 150 * time.Millisecond
	srv.arrived = make(chan int, 10)
	tr, j, _ := newTestTransport(t)

	const body = `{"amount":4200,"order":"A-1001"}`
	var wg sync.WaitGroup
	bodies := make([]string, 2)
	statuses := make([]int, 2)
	tap := func(i int) {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
		if assert.NoError(t, err) {
			statuses[i] = resp.StatusCode
			bodies[i] = readAll(t, resp)
		}
	}
	wg.Add(1)
	go tap(0)
	<-srv.arrived // the first tap is at the server
	wg.Add(1)
	go tap(1)
	wg.Wait()

	assert.Equal(t, 1, srv.chargeCount(), "a double tap charged twice")
	assert.Len(t, srv.seen(), 1, "the second tap sent a request of its own")
	assert.Equal(t, []int{201, 201}, statuses)
	assert.Equal(t, bodies[0], bodies[1], "each caller reads the one answer")
	assert.NotEmpty(t, bodies[0])

	// After both finished, the same request again is a new payment.
	go func() {
		for range srv.arrived {
		}
	}()
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
	require.NoError(t, err)
	readAll(t, resp)
	close(srv.arrived)
	reqs := srv.seen()
	require.Len(t, reqs, 2)
	assert.NotEqual(t, reqs[0].Key, reqs[1].Key, "a deliberate repeat after completion is a new action")
	assert.Equal(t, 2, srv.chargeCount())
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un)
}

// Concurrent callers of one named action share its flight too: one request,
// not one each in turn.
func TestNamedActionCallersShareTheFlight(t *testing.T) {
	srv := newPayServer(t)
	srv.delay = 100 * time.Millisecond
	srv.arrived = make(chan int, 100)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:order-B-7")
	var wg sync.WaitGroup
	var ok atomic.Int32
	call := func() {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
		if assert.NoError(t, err) && assert.Equal(t, 201, resp.StatusCode) {
			assert.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))
			ok.Add(1)
		}
	}
	wg.Add(1)
	go call()
	<-srv.arrived
	for range 9 {
		wg.Add(1)
		go call()
	}
	wg.Wait()
	assert.Equal(t, int32(10), ok.Load())
	assert.Len(t, srv.seen(), 1, "callers of one named action each sent a request")
	assert.Equal(t, 1, srv.chargeCount())
}

// When the caller leading a flight gives up (its context ends), a caller
// that joined it carries the action on, with the same key.
func TestJoinedCallerCarriesOnWithTheSameKey(t *testing.T) {
	srv := newPayServer(t)
	srv.delay = 300 * time.Millisecond
	srv.arrived = make(chan int, 10)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	// The real clock: the 409s while the first charge is in progress are
	// waited out.
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()),
		idemretry.WithBackOff(constant(100*time.Millisecond)), idemretry.WithMaxRetries(20))
	require.NoError(t, err)
	defer tr.Close()
	const body = `{"amount":7}`

	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	var joinerStatus int
	go func() {
		defer wg.Done()
		_, err := tr.RoundTrip(post(t, leaderCtx, srv.URL, body))
		assert.ErrorIs(t, err, context.Canceled)
	}()
	<-srv.arrived
	go func() {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
		if assert.NoError(t, err) {
			joinerStatus = resp.StatusCode
			readAll(t, resp)
		}
	}()
	time.Sleep(50 * time.Millisecond) // the second caller has joined
	cancelLeader()
	go func() {
		for range srv.arrived {
		}
	}()
	wg.Wait()
	close(srv.arrived)
	assert.Equal(t, 201, joinerStatus)
	assert.Equal(t, 1, srv.chargeCount())
	keys := keysOf(srv.seen())
	require.GreaterOrEqual(t, len(keys), 2)
	for _, k := range keys {
		assert.Equal(t, keys[0], k)
	}
}

// Item 1: net/http resends a request that carries an Idempotency-Key by
// itself when a reused keep-alive connection breaks after the request was
// written; if that hidden resend fails to dial, only the dial error is seen.
// The server did charge: MaybeProcessed must say so.
func TestMaybeProcessedAfterHiddenResend(t *testing.T) {
	var charges atomic.Int32
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/warm" {
			w.WriteHeader(http.StatusOK)
			return
		}
		charges.Add(1)
		srv.Listener.Close() // the resend cannot connect
		hijackAndClose(w)    // the answer is lost after the charge
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()),
		idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	warm, err := base.RoundTrip(httptestGet(t, srv.URL+"/warm"))
	require.NoError(t, err)
	readAll(t, warm) // the connection goes back to the pool, to be reused

	_, err = tr.RoundTrip(post(t, context.Background(), srv.URL+"/pay", `{"amount":5}`))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, int32(1), charges.Load(), "the server charged")
	assert.True(t, ae.MaybeProcessed, "the server charged, but MaybeProcessed is false (err: %v)", err)
}

func httptestGet(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}

// cancelAtAnswer is a base transport that ends the caller's context just as
// the server's answer arrives: a deadline landing on a final answer.
type cancelAtAnswer struct {
	base   http.RoundTripper
	cancel context.CancelFunc
}

func (c *cancelAtAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	c.cancel()
	return resp, err
}

// Item 3: a final answer that arrives as the caller's context ends is
// returned, so it must be recorded done; else a deliberate repeat of an
// unnamed payment reuses its key and gets a replay instead of a charge.
func TestFinalAnswerAtDeadlineIsRecordedDone(t *testing.T) {
	srv := newPayServer(t)
	j := journal.NewMemory()
	http1 := &http.Transport{}
	defer http1.CloseIdleConnections()
	cb := &cancelAtAnswer{base: http1}
	tr, err := idemretry.NewTransport(cb, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()

	ctx, cancel := context.WithCancel(context.Background())
	cb.cancel = cancel
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":9}`))
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	resp.Body.Close()
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un, "a 201 was returned but the journal says pending")

	cb.cancel = func() {}
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":9}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, srv.chargeCount(), "the deliberate second payment was answered with the first one's replay")
}

// flakyJournal wraps a Memory: its Updates to done fail while failDone
// is set, and hang (until their context ends) while hang is set.
type flakyJournal struct {
	*journal.Memory
	failDone, hang atomic.Bool
}

var errDiskGone = errors.New("test: storage unavailable")

func (f *flakyJournal) Update(ctx context.Context, rec journal.Record) error {
	if f.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.failDone.Load() && rec.State == journal.StateDone {
		return errDiskGone
	}
	return f.Memory.Update(ctx, rec)
}

// Item 4: an update to done that fails must not leave a record that makes
// the next deliberate identical payment reuse the old key (two payments, one
// charge, and a 201 that nobody paid).
func TestFailedDoneUpdateNeverReusesTheKey(t *testing.T) {
	srv := newPayServer(t)
	j := &flakyJournal{Memory: journal.NewMemory()}
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()

	j.failDone.Store(true)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":3}`))
	require.NoError(t, err)
	readAll(t, resp)

	// Still failing: the second payment is refused, not sent under the old key.
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":3}`))
	if err == nil {
		body := readAll(t, resp)
		assert.Equal(t, 2, srv.chargeCount(), "second payment answered %d %s without a charge", resp.StatusCode, body)
	} else {
		assert.ErrorIs(t, err, errDiskGone)
		assert.Len(t, srv.seen(), 1, "nothing is sent while the outcome is not recorded")
	}

	// The journal heals: the outcome lands, and the repeat is a new payment.
	j.failDone.Store(false)
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":3}`))
	require.NoError(t, err)
	readAll(t, resp)
	reqs := srv.seen()
	assert.NotEqual(t, reqs[0].Key, reqs[len(reqs)-1].Key)
	assert.Equal(t, len(reqs), srv.chargeCount(), "a request was answered with a replay")
}

// Item 5: a journal that hangs when the outcome is recorded must not hold
// RoundTrip past the caller's deadline (beyond a documented grace).
func TestHangingJournalUpdateBoundedByDeadline(t *testing.T) {
	srv := newPayServer(t)
	j := &flakyJournal{Memory: journal.NewMemory()}
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j))
	require.NoError(t, err)

	j.hang.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":8}`))
	took := time.Since(start)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Less(t, took, 500*time.Millisecond+time.Second, "RoundTrip with a 500 ms deadline took %v", took)
	j.hang.Store(false)
	require.NoError(t, tr.Close(), "Close lands the outcome the journal did not take in time")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un)
}

// Item 7: a caller key set under a non-canonical header name is the
// request's key: one Idempotency-Key value goes out, the caller's.
func TestLowerCaseCallerKeyHeader(t *testing.T) {
	var got [][]string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(201)
	}))
	defer srv.Close()
	tr, j, _ := newTestTransport(t)
	req := post(t, context.Background(), srv.URL, `{"amount":2}`)
	req.Header["idempotency-key"] = []string{"order-77-pay"}
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, got, 1)
	assert.Equal(t, []string{"order-77-pay"}, got[0], "the request left with these Idempotency-Key values")
	rec, created, err := j.Reserve(context.Background(), journal.Record{ActionID: "key:order-77-pay", Key: "x"}, journal.ReuseAny)
	require.NoError(t, err)
	assert.False(t, created, "the caller's key did not name the action")
	assert.Equal(t, "order-77-pay", rec.Key)

	// Two spellings with two values are two keys: refused.
	req = post(t, context.Background(), srv.URL, `{"amount":2}`)
	req.Header["idempotency-key"] = []string{"a-1"}
	req.Header.Set("Idempotency-Key", "b-2")
	_, err = tr.RoundTrip(req)
	assert.ErrorIs(t, err, idemretry.ErrInvalidKey)
}

// Item 12: a 503 whose body stalls must not hang RoundTrip: draining a
// discarded body is bounded in time as well as bytes.
func TestStalledDiscardedBodyIsCut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.(http.Flusher).Flush()
		for i := 0; i < 300; i++ { // a byte every 100 ms, for 30 s
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprint(w, "x")
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(2))
	done := make(chan struct{})
	var resp *http.Response
	var err error
	start := time.Now()
	go func() {
		defer close(done)
		resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("RoundTrip hung on a stalled 503 body")
	}
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode)
	resp.Body.Close()
	assert.Less(t, time.Since(start), 10*time.Second)
}
