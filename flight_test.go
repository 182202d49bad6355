package idemretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// R1: a panic inside the leader's RoundTrip (here a user RetryPolicy; could be
// OnRetry, the key generator, the journal or the base transport) leaves the
// flight in the map with done never closed: every later request of the action
// waits forever (here bounded by a 1 s test deadline) and sends nothing.
func TestFlightPanicInLeaderStrandsFlight(t *testing.T) {
	srv := newPayServer(t)
	var boom atomic.Bool
	boom.Store(true)
	tr, _, _ := newTestTransport(t, idemretry.WithRetryPolicy(func(ctx context.Context, resp *http.Response, err error) bool {
		if boom.Load() {
			panic("policy bug")
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}))
	actx := idemretry.WithAction(context.Background(), "pay:panic-1")
	func() {
		defer func() { recover() }() // what http.Server does for a handler
		tr.RoundTrip(post(t, actx, srv.URL, `{"amount":1}`))
	}()
	boom.Store(false)
	ctx, cancel := context.WithTimeout(actx, time.Second)
	defer cancel()
	err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":1}`))
	require.NoError(t, err, "the action is stuck behind a flight that never lands")
}

// R2: http.Client (with Timeout, as the README recommends) writes resp.Body
// after RoundTrip returns; a joiner's result() copies *f.resp at the same time.
func TestFlightSharedResponseRaceWithClientTimeout(t *testing.T) {
	srv := newSlowPayServer(t, 100*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	ctx := idemretry.WithAction(context.Background(), "pay:race-1")
	leaderThenJoiners(srv, 8, func() {
		resp, err := client.Do(post(t, ctx, srv.URL, `{"amount":2}`))
		if assert.NoError(t, err) {
			_ = resp.Header // (Header.Set here adds a map race too)
			readAll(t, resp)
		}
	})
	assert.Equal(t, 1, srv.chargeCount())
}

// hangPendingJournal hangs Updates to pending until their context ends.
type hangPendingJournal struct {
	*journal.Memory
}

func (h hangPendingJournal) Update(ctx context.Context, rec journal.Record) error {
	if rec.State == journal.StatePending {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Memory.Update(ctx, rec)
}

// R3: the pending-count write made before the first retry wait uses
// outcomeContext (WithoutCancel): a caller who cancels while the journal is
// slow waits the whole journal timeout (5 s), not "promptly".
func TestFlightCancelDuringPendingWriteIsPrompt(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	j := hangPendingJournal{journal.NewMemory()}
	tr := transportOver(t, j)
	ctx, cancel := context.WithCancel(context.Background())
	srv.arrived = make(chan int, 10)
	go func() { <-srv.arrived; time.Sleep(100 * time.Millisecond); cancel() }()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":3}`))
	took := time.Since(start)
	if err == nil {
		resp.Body.Close()
	}
	assert.Less(t, took, 100*time.Millisecond+idemretry.OutcomeGrace+300*time.Millisecond,
		"RoundTrip returned %v after a cancel at ~100 ms", took)
}

// R4: a deadline that ends during an attempt: README says Reason is nil when
// the caller's deadline ended the action (test Err then).
func TestFlightDeadlineDuringAttemptReasonNil(t *testing.T) {
	srv := newPayServer(t)
	srv.delay = 500 * time.Millisecond
	tr, _, _ := newTestTransport(t)
	ctx, cancel := context.WithTimeout(idemretry.WithAction(context.Background(), "pay:dl-1"), 100*time.Millisecond)
	defer cancel()
	err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":4}`))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Nil(t, ae.Reason, "Reason = %v", ae.Reason)
}

// R5: a joiner with no deadline is handed the leader's give-up made for the
// leader's own short deadline (ErrWaitExceedsDeadline), instead of carrying on.
func TestFlightJoinerGetsLeadersDeadlineGiveUp(t *testing.T) {
	srv := newSlowPayServer(t, 200*time.Millisecond)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			time.Sleep(200 * time.Millisecond)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			return true
		}
		return false
	}
	tr := transportOver(t, journal.NewMemory())
	actx := idemretry.WithAction(context.Background(), "pay:dl-2")
	lctx, cancel := context.WithTimeout(actx, 600*time.Millisecond)
	defer cancel()
	go func() {
		_ = sendErr(tr, post(t, lctx, srv.URL, `{"amount":5}`))
	}()
	<-srv.arrived
	go func() {
		for range srv.arrived {
		}
	}()
	resp, err := tr.RoundTrip(post(t, actx, srv.URL, `{"amount":5}`)) // no deadline
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, 201, resp.StatusCode, "give-up reason %v", idemretry.GiveUpReason(resp))
}

// R6: an unnamed double tap answered 307: the joiner gets a copy of the 307
// and its http.Client follows it; if the leader's hop has landed by then,
// the joiner's hop is a new unnamed action: a new key and a second charge.
func TestFlightUnnamedDoubleTapThrough307(t *testing.T) {
	srv, charges, arrived := newRedirectPayServer(t, 100*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	leaderDone := make(chan struct{})
	leader := &http.Client{Transport: tr}
	joiner := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		<-leaderDone // the joiner's goroutine is scheduled a little later
		return nil
	}}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(leaderDone)
		resp, err := leader.Do(post(t, context.Background(), srv.URL+"/pay", `{"amount":6}`))
		if assert.NoError(t, err) {
			readAll(t, resp)
		}
	}()
	<-arrived
	go func() {
		defer wg.Done()
		resp, err := joiner.Do(post(t, context.Background(), srv.URL+"/pay", `{"amount":6}`))
		if assert.NoError(t, err) {
			readAll(t, resp)
		}
	}()
	wg.Wait()
	assert.Equal(t, int32(1), charges.Load(), "an unnamed double tap charged twice")
}

// R6 without any gate: how often does a plain unnamed double tap through a
// 307 charge twice?
func TestFlightUnnamedDoubleTapThrough307NoGate(t *testing.T) {
	srv, charges, arrived := newRedirectPayServer(t, 50*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	client := &http.Client{Transport: tr}
	const rounds = 30
	for i := 0; i < rounds; i++ {
		body := `{"amount":` + string(rune('a'+i)) + `}`
		var wg sync.WaitGroup
		wg.Add(2)
		tap := func() {
			defer wg.Done()
			resp, err := client.Do(post(t, context.Background(), srv.URL+"/pay", body))
			if assert.NoError(t, err) {
				readAll(t, resp)
			}
		}
		go tap()
		<-arrived
		go tap()
		wg.Wait()
	}
	assert.Equal(t, int32(rounds), charges.Load(), "%d unnamed double taps charged %d times", rounds, charges.Load())
}

// newRedirectPayServer answers POST /pay with a 307 to /v2/pay after delay,
// signalling arrived as each /pay request comes in; /v2/pay charges once per
// Idempotency-Key and counts the charges.
func newRedirectPayServer(t *testing.T, delay time.Duration) (srv *httptest.Server, charges *atomic.Int32, arrived chan struct{}) {
	t.Helper()
	charges = new(atomic.Int32)
	var mu sync.Mutex
	keys := map[string]bool{}
	arrived = make(chan struct{}, 1000)
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/pay" {
			arrived <- struct{}{}
			time.Sleep(delay)
			w.Header().Set("Location", "/v2/pay")
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		}
		k := r.Header.Get("Idempotency-Key")
		mu.Lock()
		if !keys[k] {
			keys[k] = true
			charges.Add(1)
		}
		mu.Unlock()
		w.WriteHeader(201)
	})
	return srv, charges, arrived
}

// Held-up probes.

func TestFlightConcurrentJoinersReadTrailersAndGiveUp(t *testing.T) {
	srv := newPayServer(t)
	srv.arrived = make(chan int, 100)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(100 * time.Millisecond)
		w.Header().Set("Trailer", "X-T")
		w.WriteHeader(503)
		io.WriteString(w, strings.Repeat("x", 1000))
		w.Header().Set("X-T", "tv")
		return true
	}
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), "pay:tr-1")
	leaderThenJoiners(srv, 6, func() {
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":7}`))
		if assert.NoError(t, err) {
			b := readAll(t, resp)
			assert.Len(t, b, 1000)
			assert.Equal(t, "tv", resp.Trailer.Get("X-T"))
			assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted)
		}
	})
	assert.Len(t, srv.seen(), 1)
}

func TestFlightJoinerContextEnds(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	tr, j, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:jc-1")
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":8}`))
		if assert.NoError(t, err) {
			assert.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))
		}
	}()
	<-srv.arrived
	jctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := tr.RoundTrip(post(t, jctx, srv.URL, `{"amount":8}`))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.True(t, ae.MaybeProcessed)
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
	<-done
	un, _ := j.Unfinished(context.Background())
	assert.Empty(t, un)
}

func TestFlightNotSharedLeaderReadsAll(t *testing.T) {
	srv := newPayServer(t)
	srv.arrived = make(chan int, 10)
	big := strings.Repeat("y", 5000)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(100 * time.Millisecond)
		w.WriteHeader(201)
		io.WriteString(w, big)
		return true
	}
	tr, _, _ := newTestTransport(t, idemretry.WithMaxSharedResponse(1000))
	ctx := idemretry.WithAction(context.Background(), "pay:ns-1")
	var lead string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":9}`))
		if assert.NoError(t, err) {
			lead = readAll(t, resp)
		}
	}()
	<-srv.arrived
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":9}`))
	assert.ErrorIs(t, err, idemretry.ErrResponseNotShared)
	wg.Wait()
	assert.Equal(t, big, lead)
}

type slowReserveJournal struct {
	*journal.Memory
	gate chan struct{}
}

func (s *slowReserveJournal) Reserve(ctx context.Context, rec journal.Record, m journal.ReserveMode) (journal.Record, bool, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return journal.Record{}, false, ctx.Err()
	}
	return s.Memory.Reserve(ctx, rec, m)
}

func TestFlightLeaderCancelledInReserveHandsOver(t *testing.T) {
	srv := newPayServer(t)
	j := &slowReserveJournal{journal.NewMemory(), make(chan struct{})}
	tr := transportOver(t, j)
	lctx, cancel := context.WithCancel(context.Background())
	ldone := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(post(t, lctx, srv.URL, `{"amount":10}`))
		ldone <- err
	}()
	time.Sleep(50 * time.Millisecond)
	jdone := make(chan struct{})
	go func() {
		defer close(jdone)
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":10}`))
		if assert.NoError(t, err) {
			assert.Equal(t, 201, resp.StatusCode)
			readAll(t, resp)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-ldone, context.Canceled)
	close(j.gate)
	<-jdone
	assert.Equal(t, 1, srv.chargeCount())
}

// unlanded outcome, journal recovers only after Forget; other actions unaffected.
func TestFlightUnlandedForgetOtherAction(t *testing.T) {
	srv := newPayServer(t)
	j := &flakyJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j)
	a := idemretry.WithAction(context.Background(), "pay:A")
	b := idemretry.WithAction(context.Background(), "pay:B")
	j.failDone.Store(true)
	roundTrip(t, tr, post(t, a, srv.URL, `{"amount":11}`))
	// B is independent of A's unlanded outcome (its own done fails too, kept).
	roundTrip(t, tr, post(t, b, srv.URL, `{"amount":12}`))
	// A resend while failing: refused.
	_, err := tr.RoundTrip(post(t, a, srv.URL, `{"amount":11}`))
	require.Error(t, err)
	require.Len(t, srv.seen(), 2)
	// Reconciled and forgotten: a fresh key, sent.
	require.NoError(t, j.Forget(context.Background(), "pay:A"))
	j.failDone.Store(false)
	roundTrip(t, tr, post(t, a, srv.URL, `{"amount":11}`))
	reqs := srv.seen()
	require.Len(t, reqs, 3)
	assert.NotEqual(t, reqs[0].Key, reqs[2].Key)
	// B lands at its next reserve: a replay under its key.
	roundTrip(t, tr, post(t, b, srv.URL, `{"amount":12}`))
	assert.Equal(t, 3, srv.chargeCount())
}

// Reason on a cancelled caller (control for R4).
func TestFlightCancelDuringAttemptReasonNil(t *testing.T) {
	srv := newPayServer(t)
	srv.delay = 500 * time.Millisecond
	tr, _, _ := newTestTransport(t)
	ctx, cancel := context.WithCancel(idemretry.WithAction(context.Background(), "pay:cx-1"))
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":4}`))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Nil(t, ae.Reason)
}

// The seeds' first story: the screen hangs, the customer taps again. Two
// identical POSTs with no action id and no key, the second sent while the
// first is in flight, are one payment: one request, one charge, and each
// caller reads the same answer. A third identical POST after both finished
// is a deliberate repeat: a new key and a second charge.
func TestUnnamedDoubleTapIsOnePayment(t *testing.T) {
	srv := newSlowPayServer(t, 150*time.Millisecond)
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
	roundTrip(t, tr, post(t, context.Background(), srv.URL, body))
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
	srv := newSlowPayServer(t, 100*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:order-B-7")
	var ok atomic.Int32
	leaderThenJoiners(srv, 10, func() {
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
		if assert.NoError(t, err) && assert.Equal(t, 201, resp.StatusCode) {
			assert.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))
			ok.Add(1)
		}
	})
	assert.Equal(t, int32(10), ok.Load())
	assert.Len(t, srv.seen(), 1, "callers of one named action each sent a request")
	assert.Equal(t, 1, srv.chargeCount())
}

// When the caller leading a flight gives up (its context ends), a caller
// that joined it carries the action on, with the same key.
func TestJoinedCallerCarriesOnWithTheSameKey(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	// The real clock: the 409s while the first charge is in progress are
	// waited out.
	tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(100*time.Millisecond)), idemretry.WithMaxRetries(20))
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

// A flight whose response is larger than the sharing limit: the first
// caller streams it whole, a caller that joined gets ErrResponseNotShared
// with the status, and the server charged once.
func TestSharedResponseOverLimit(t *testing.T) {
	big := strings.Repeat("r", 4096)
	arrived := make(chan struct{}, 4)
	release := make(chan struct{})
	var charges int
	var mu sync.Mutex
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		charges++
		mu.Unlock()
		arrived <- struct{}{}
		<-release
		w.WriteHeader(201)
		w.Write([]byte(big))
	})
	tr, _, _ := newTestTransport(t, idemretry.WithMaxSharedResponse(1024))
	var wg sync.WaitGroup
	var leadBody string
	var joinErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
		if assert.NoError(t, err) {
			leadBody = readAll(t, resp)
		}
	}()
	<-arrived
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, joinErr = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	}()
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	assert.Equal(t, big, leadBody)
	require.ErrorIs(t, joinErr, idemretry.ErrResponseNotShared)
	var ae *idemretry.ActionError
	require.ErrorAs(t, joinErr, &ae)
	assert.Equal(t, 201, ae.Status)
	assert.Equal(t, 1, charges)
}
