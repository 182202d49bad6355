package idemretry_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// stallingReserve is a memory journal whose first Reserve after arm
// stalls (entered says it has begun) until gate closes, then goes through,
// or, gate nil, until its context ends; the others pass.
type stallingReserve struct {
	*journal.Memory
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func newStallingReserve(gated bool) *stallingReserve {
	s := &stallingReserve{Memory: journal.NewMemory(), entered: make(chan struct{})}
	if gated {
		s.gate = make(chan struct{})
	}
	return s
}

func (s *stallingReserve) arm() { s.armed.Store(true) }

func (s *stallingReserve) Reserve(ctx context.Context, rec journal.Record, m journal.ReserveMode) (journal.Record, bool, error) {
	if s.armed.CompareAndSwap(true, false) {
		s.entered <- struct{}{}
		if s.gate == nil {
			<-ctx.Done()
			return journal.Record{}, false, ctx.Err()
		}
		<-s.gate
	}
	return s.Memory.Reserve(ctx, rec, m)
}

// The callers that joined a flight whose leader stopped before it reserved
// anything are one tap with it: they lead the flight on one at a time, and
// the action is paid once, under one key, whichever of them leads and
// however late the others wake. Each round's body was paid once before
// (done, so the tap is a new payment), as in the history the simulator
// found: there, woken to go again each on its own, a joiner that boarded
// after another had finished found that payment done and made a second.
func TestFlightJoinersOfALeaderStoppedInReserveAreOneTap(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	j := newStallingReserve(false)
	tr := transportOver(t, j)
	const rounds, joiners = 20, 4
	for round := range rounds {
		body := fmt.Sprintf(`{"amount":10,"round":%d}`, round)
		roundTrip(t, tr, post(t, context.Background(), srv.URL, body)) // paid before: done
		before := srv.chargeCount()

		j.arm()
		lctx, cancel := context.WithCancel(context.Background())
		lerr := make(chan error, 1)
		go func() {
			_, err := tr.RoundTrip(post(t, lctx, srv.URL, body))
			lerr <- err
		}()
		<-j.entered
		answers := make(chan string, joiners)
		for range joiners {
			go func() {
				resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
				if err != nil {
					answers <- err.Error()
					return
				}
				answers <- fmt.Sprint(resp.StatusCode, " ", readAll(t, resp))
			}()
		}
		require.Eventually(t, func() bool { return idemretry.FlightJoiners(tr) == joiners }, 5*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-lerr, context.Canceled)
		var got []string
		for range joiners {
			got = append(got, <-answers)
		}
		require.Equal(t, before+1, srv.chargeCount(), "round %d: one tap charged %d times: %q", round, srv.chargeCount()-before, got)
		for _, a := range got {
			require.Equal(t, got[0], a, "round %d: the taps were told different things", round)
		}
		require.True(t, strings.HasPrefix(got[0], "201 "), "round %d: %s", round, got[0])
	}
}

// unlanded outcome, journal recovers only after Forget; other actions unaffected.
func TestFlightUnlandedForgetOtherAction(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// Callers of one unnamed action arriving while its leader lands, round
// after round: a joiner must never wait for a wake-up that does not come
// (the flight's channel is made only when someone joins). Every call
// returns well before its generous deadline, with an answer.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewJoinersAtTheLandingAreWoken).
func TestFlightJoinersAtTheLandingAreWoken(t *testing.T) {
	var charges atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	tr, _, _ := newTestTransport(t)
	const rounds, callers = 150, 6
	var calls atomic.Int32
	for round := range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var wg sync.WaitGroup
		errc := make(chan error, callers)
		start := make(chan struct{})
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := tr.RoundTrip(post(t, ctx, srv.URL, fmt.Sprintf(`{"round":%d}`, round)))
				if err != nil {
					errc <- err
					return
				}
				calls.Add(1)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				resp.Body.Close() // a second Close is harmless
				if err != nil || resp.StatusCode != http.StatusCreated || string(b) != `{"ok":true}` {
					errc <- fmt.Errorf("round %d: %d %q %v", round, resp.StatusCode, b, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		cancel()
		close(errc)
		for err := range errc {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	t.Logf("%d calls, %d requests charged", calls.Load(), charges.Load())
	require.Equal(t, int32(rounds*callers), calls.Load())
	require.LessOrEqual(t, charges.Load(), int32(rounds*callers))
}

// A joiner whose own context ends stops waiting with its context's error;
// the leader's answer is unaffected, and one request was sent.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewJoinerContextEnds).
func TestFlightJoinersOwnContextEndsItsWait(t *testing.T) {
	srv := newSlowPayServer(t, 400*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	var leaderResp *http.Response
	var leaderErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		leaderResp, leaderErr = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":7}`))
	}()
	<-srv.arrived
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":7}`))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	<-done
	require.NoError(t, leaderErr)
	require.Equal(t, http.StatusCreated, leaderResp.StatusCode)
	readAll(t, leaderResp)
	require.NoError(t, leaderResp.Body.Close(), "a second Close")
	require.Equal(t, 1, srv.chargeCount())
}

// I2: 100 goroutines sending the same action: the server sees one key and
// charges once; the goroutines take turns instead of colliding (no 409s).
func TestConcurrentSameActionOneKey(t *testing.T) {
	srv := newPayServer(t)
	inFlight, conflicts := 0, 0
	var mu sync.Mutex
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		inFlight++
		busy := inFlight > 1
		if busy {
			conflicts++
		}
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		if busy {
			status(http.StatusConflict)(w)
			return true
		}
		time.Sleep(time.Millisecond)
		return false
	}
	tr, _, _ := newTestTransport(t)
	var wg sync.WaitGroup
	statuses := make([]int, 100)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := idemretry.WithAction(context.Background(), "pay:double-click")
			resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
			if assert.NoError(t, err) {
				statuses[i] = resp.StatusCode
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	reqs := srv.seen()
	// The callers share flights: the server sees far fewer than 100 requests,
	// none of them a 409 from two racing under one key.
	require.NotEmpty(t, reqs)
	assert.Less(t, len(reqs), 100)
	mu.Lock()
	assert.Zero(t, conflicts, "two requests of one action raced")
	mu.Unlock()
	for _, r := range reqs {
		require.Equal(t, reqs[0].Key, r.Key)
	}
	for _, s := range statuses {
		assert.Equal(t, http.StatusCreated, s)
	}
	assert.Equal(t, 1, srv.chargeCount())
}

// A caller that joins an action's flight waits for its leader "bounded by
// its own context" (RoundTrip's doc). A context with a deadline and no
// Done channel did not bound it: the joiner, due back at 300 ms, waited
// the leader's 4 s attempt out (and got its answer), where the lease's
// polls and every journal call end at such a deadline.
//
// Found in review hv3 (8c60b37; was TestHV3JoinerWithADeadlineAndNoDoneEndsAtItsDeadline).
func TestFlightJoinerWithADeadlineAndNoDoneEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	srv := newSlowPayServer(t, 4*time.Second)
	tr := transportOver(t, journal.NewMemory())
	lead := sendAsync(tr, post(t, idemretry.WithAction(context.Background(), "pay:hv3-nodone-join"), srv.URL, `{"amount":4}`))
	<-srv.arrived // the leader's attempt is on the wire
	ctx := idemretry.WithAction(noDoneContext{Context: context.Background(), dl: time.Now().Add(300 * time.Millisecond)}, "pay:hv3-nodone-join")
	start := time.Now()
	err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":4}`))
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the joiner waited for the leader past its deadline (%v)", took)
	require.NoError(t, <-lead)
	require.Equal(t, 1, srv.chargeCount())
}

// hW1's review: double taps, named and unnamed, over the default file
// journal and a restart, with the callers' deadlines, cancels and
// http.Client timeouts landing anywhere around the server's answers, and
// bodies at and around the keyed fingerprint's 512 bytes and its 64 KiB
// chunk, sent with and without GetBody.

// tapLedger is the shared payment server (internal/paytest) with
// deadlineLedger's random charge times and 503s (without its slow bodies),
// refusing (as a test failure) the start of a charge of a payload under
// one key while another key's charge of the same payload is under way:
// one tap pair, two payments.
type tapLedger struct {
	*paytest.Server
	mu       sync.Mutex
	rnd      *rand.Rand
	fail     map[int]bool        // by request number
	charging map[[32]byte]string // payload -> the key whose charge runs
	overlaps []string
}

func newTapLedger(seed uint64) *tapLedger {
	l := &tapLedger{rnd: rand.New(rand.NewPCG(seed, 1)), fail: map[int]bool{}, charging: map[[32]byte]string{}}
	l.Server = paytest.New(
		paytest.WithProcessing(func(n int, r *http.Request) {
			sum, key := sha256.Sum256(l.Requests()[n-1].Body), r.Header.Get(paytest.KeyHeader)
			l.mu.Lock()
			delay := time.Duration(l.rnd.IntN(25)) * time.Millisecond
			fail := l.rnd.IntN(8) == 0
			l.fail[n] = fail
			if !fail {
				if other, ok := l.charging[sum]; ok {
					l.overlaps = append(l.overlaps, fmt.Sprintf("payload %x: charge under %s began while %s's ran", sum[:4], key, other))
				}
				l.charging[sum] = key
			}
			l.mu.Unlock()
			time.Sleep(delay)
			l.mu.Lock()
			if !fail && l.charging[sum] == key {
				delete(l.charging, sum)
			}
			l.mu.Unlock()
		}),
		paytest.WithFailure(func(n int, _ *http.Request) (int, bool) {
			l.mu.Lock()
			defer l.mu.Unlock()
			return http.StatusServiceUnavailable, l.fail[n] // not processed
		}))
	return l
}

// keysOfPayload returns, for each payload, the keys it was sent under.
func (l *tapLedger) keysOfPayload() map[[32]byte]map[string]bool {
	out := map[[32]byte]map[string]bool{}
	for _, r := range l.Requests() {
		sum := sha256.Sum256(r.Body)
		if out[sum] == nil {
			out[sum] = map[string]bool{}
		}
		out[sum][r.Header.Get(paytest.KeyHeader)] = true
	}
	return out
}

// tapBody is the body of payload i: sizes at and around the keyed
// fingerprint's threshold and its chunk.
func tapBody(i int) []byte {
	sizes := []int{100, 511, 512, 513, 64 << 10, 64<<10 + 1}
	b := bytes.Repeat([]byte{'a' + byte(i)}, sizes[i%len(sizes)])
	copy(b, fmt.Sprintf(`{"p":%d}`, i))
	return b
}

// Found in review hw1 (03eab9b; was TestHW1TapsAroundDeadlinesAndARestart).
func TestFlightTapsAroundDeadlinesAndARestart(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	l := newTapLedger(seed)
	srv := newServer(t, l.ServeHTTP)
	dir := t.TempDir()
	const payloads = 6
	const slack = 2 * time.Second // a noisy 2-core machine

	phase := func(tr *idemretry.Transport, phase int) {
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for p := range 2 * payloads { // payloads 0-5 named, 6-11 unnamed
			for g := range 3 { // three tappers each
				wg.Add(1)
				go func() {
					defer wg.Done()
					rnd := rand.New(rand.NewPCG(seed, uint64(1000*phase+10*p+g)))
					body := tapBody(p % payloads)
					if p >= payloads {
						body = append(body, 'u') // unnamed: another payload
					}
					for range 8 {
						ctx := context.Background()
						if p < payloads {
							ctx = idemretry.WithAction(ctx, fmt.Sprintf("pay:%d", p))
						}
						var cancel context.CancelFunc = func() {}
						c := &http.Client{Transport: tr}
						d := time.Duration(1+rnd.IntN(40)) * time.Millisecond
						switch rnd.IntN(4) {
						case 0:
							ctx, cancel = context.WithTimeout(ctx, d)
						case 1:
							ctx, cancel = context.WithCancel(ctx)
							stop := time.AfterFunc(d, cancel)
							defer stop.Stop()
						case 2:
							c.Timeout = d
						default:
							d = time.Hour
						}
						var rd io.Reader = bytes.NewReader(body) // GetBody
						if rnd.IntN(2) == 0 {
							rd = struct{ io.Reader }{bytes.NewReader(body)} // no GetBody: buffered
						}
						req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", rd)
						start := time.Now()
						resp, err := c.Do(req)
						if el := time.Since(start); el > d+idemretry.OutcomeGrace+slack {
							errs <- fmt.Errorf("payload %d: returned %v after a %v bound", p, el, d)
						}
						if resp != nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						cancel()
						var ae *idemretry.ActionError
						if errors.As(err, &ae) && (errors.Is(err, idemretry.ErrFingerprintMismatch) || errors.Is(err, idemretry.ErrFingerprintUncheckable)) {
							errs <- fmt.Errorf("payload %d: the same payload refused: %v", p, err)
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	for ph := range 2 { // a restart between the phases
		tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir),
			idemretry.WithBackOff(constant(5*time.Millisecond)), idemretry.WithRetryBudget(0, 0))
		require.NoError(t, err)
		phase(tr, ph)
		require.NoError(t, tr.Close())
	}
	checkNoPackageGoroutines(t)

	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.overlaps {
		t.Error(o)
	}
	keys := l.keysOfPayload()
	for p := range payloads {
		sum := sha256.Sum256(tapBody(p))
		if n := len(keys[sum]); n > 1 {
			t.Errorf("named action pay:%d went out under %d keys", p, n)
		}
	}
	for k, n := range chargesPerKey(l.Charges()) {
		if n > 1 {
			t.Errorf("key %s charged %d times", k, n)
		}
	}
}
