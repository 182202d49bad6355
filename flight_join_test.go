package idemretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Issue 26, item 1: an unnamed payment is charged and its answer lost;
// while Resume rebuilds it the user taps again (the tap gets the replay,
// the action is done); Resume then resends it under its old key, and while
// that resend is at the server the user pays the same amount deliberately.
// The new payment is a new action (its own reservation finds the first one
// done): it must not join Resume's flight and be handed the first payment's
// replay.
func TestFlightResumeResendOfADonePaymentIsNotJoinedByANewOne(t *testing.T) {
	t.Parallel()
	const body = `{"amount":1200}`
	srv := newPayServer(t)
	j := journal.NewMemory()
	srv.commitThenDrop = map[int]bool{1: true}
	leftPending(t, j, post(t, context.Background(), srv.URL, body))
	tr := transportOver(t, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
	done := resumeAsync(ctx, tr, g, 1)
	<-g.rebuilding
	tap := roundTrip(t, tr, post(t, ctx, srv.URL, body)) // request 2: the tap, under the pending key
	require.True(t, idemretry.IsReplay(tap), "the tap goes out under the pending key")

	atServer, release := holdRequest(t, srv, 3) // Resume's resend
	close(g.gate)
	<-atServer
	again := payAsync(tr, post(t, ctx, srv.URL, body))
	awaitJoiners(t, tr, 1)
	release()

	p := <-again
	require.NoError(t, p.err)
	assert.False(t, p.replay, "a payment made after the first finished was handed the first one's replay")
	assert.Equal(t, 2, srv.chargeCount(), "the deliberate payment was not charged")
	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.res, 1)
	assert.Equal(t, http.StatusCreated, r.res[0].Status)
	keys := keysOf(srv.seen())
	require.Len(t, keys, 4)
	assert.Equal(t, []string{keys[0], keys[0], keys[0]}, keys[:3], "the tap and Resume's resend carry the first key")
	assert.NotEqual(t, keys[0], keys[3], "the new payment has a key of its own")
}

// Issue 26, item 2: with WithDuplicateWindow(30s), a tap 5 s after a
// payment reuses its key (right); while the server holds that replay, the
// same payment made deliberately 65 s after the first is a new action: it
// must not join the tap's flight.
func TestFlightPaymentAfterTheDuplicateWindowIsNotJoinedToATapWithinIt(t *testing.T) {
	const body = `{"amount":3000}`
	srv := newPayServer(t)
	tr, _, clk := newTestTransport(t, idemretry.WithDuplicateWindow(30*time.Second))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, body))

	clk.Advance(5 * time.Second)
	atServer, release := holdRequest(t, srv, 2)
	tap := payAsync(tr, post(t, context.Background(), srv.URL, body))
	<-atServer
	clk.Advance(60 * time.Second)
	later := payAsync(tr, post(t, context.Background(), srv.URL, body))
	awaitJoiners(t, tr, 1)
	release()

	tp, lp := <-tap, <-later
	require.NoError(t, tp.err)
	require.NoError(t, lp.err)
	assert.True(t, tp.replay, "a tap within the window is the same payment")
	assert.False(t, lp.replay, "a payment after the window was handed the tap's replay")
	assert.Equal(t, 2, srv.chargeCount())
}

// The pairs of item 1 and 2 that must still join. Within the duplicate
// window, a tap that arrives while Resume resends the done payment joins
// Resume's flight and gets the replay; a named action (WithAction) and a
// caller-keyed one join a resend of their done action, whenever they come.
func TestFlightRepeatsThatJoinADoneActionsResend(t *testing.T) {
	const body = `{"amount":77}`
	t.Run("a tap within the window joins Resume's resend", func(t *testing.T) {
		srv := newPayServer(t)
		j := journal.NewMemory()
		srv.commitThenDrop = map[int]bool{1: true}
		leftPending(t, j, post(t, context.Background(), srv.URL, body))
		tr := transportOver(t, j, idemretry.WithDuplicateWindow(time.Hour))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
		done := resumeAsync(ctx, tr, g, 1)
		<-g.rebuilding
		require.True(t, idemretry.IsReplay(roundTrip(t, tr, post(t, ctx, srv.URL, body))))
		atServer, release := holdRequest(t, srv, 3)
		close(g.gate)
		<-atServer
		tap := payAsync(tr, post(t, ctx, srv.URL, body))
		awaitJoiners(t, tr, 1)
		release()
		p := <-tap
		require.NoError(t, p.err)
		assert.True(t, p.replay, "a tap within the window is the first payment")
		assert.Equal(t, `{"charge":"ch_1"}`, p.body)
		<-done
		assert.Equal(t, 1, srv.chargeCount())
		assert.Len(t, srv.seen(), 3, "the tap sent nothing of its own")
	})
	for _, named := range []struct {
		name string
		set  func(*http.Request) *http.Request
	}{
		{"WithAction", func(r *http.Request) *http.Request {
			return r.WithContext(idemretry.WithAction(r.Context(), "pay:order-joins"))
		}},
		{"caller key", func(r *http.Request) *http.Request { r.Header.Set("Idempotency-Key", "order-joins-key"); return r }},
	} {
		t.Run(named.name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, _, clk := newTestTransport(t)
			roundTrip(t, tr, named.set(post(t, context.Background(), srv.URL, body)))
			clk.Advance(time.Hour) // long after: a named action is the same action all its key window
			atServer, release := holdRequest(t, srv, 2)
			resend := payAsync(tr, named.set(post(t, context.Background(), srv.URL, body)))
			<-atServer
			joiner := payAsync(tr, named.set(post(t, context.Background(), srv.URL, body)))
			awaitJoiners(t, tr, 1)
			release()
			for _, p := range []paid{<-resend, <-joiner} {
				require.NoError(t, p.err)
				assert.True(t, p.replay)
				assert.Equal(t, `{"charge":"ch_1"}`, p.body)
			}
			assert.Len(t, srv.seen(), 2, "the joiner sent nothing of its own")
			assert.Equal(t, 1, srv.chargeCount())
		})
	}
}

// As above, but Resume's own context ends while its resend is at the
// server: its flight is handed over, and a waiting request carries the
// action on only if it is one: the deliberate payment is still a new one.
// (Found reviewing the fix of items 1-2: a handed-over flight's joiners
// carried its done action on, whoever they were.)
func TestFlightResumeCutShortDoesNotHandItsDonePaymentToANewOne(t *testing.T) {
	t.Parallel()
	const body = `{"amount":1300}`
	srv := newPayServer(t)
	j := journal.NewMemory()
	srv.commitThenDrop = map[int]bool{1: true}
	leftPending(t, j, post(t, context.Background(), srv.URL, body))
	tr := transportOver(t, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resumeCtx, cancelResume := context.WithCancel(ctx)
	defer cancelResume()

	g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
	done := resumeAsync(resumeCtx, tr, g, 1)
	<-g.rebuilding
	require.True(t, idemretry.IsReplay(roundTrip(t, tr, post(t, ctx, srv.URL, body))), "the tap goes out under the pending key")
	atServer, release := holdRequest(t, srv, 3) // Resume's resend, held until the test ends
	defer release()
	close(g.gate)
	<-atServer
	again := payAsync(tr, post(t, ctx, srv.URL, body))
	awaitJoiners(t, tr, 1)
	cancelResume()

	p := <-again
	require.NoError(t, p.err)
	assert.False(t, p.replay, "the new payment carried the first one on and got its replay")
	assert.Equal(t, 2, srv.chargeCount())
	<-done
}

// heldElsewhere is a Leaser over Memory whose leases another machine holds
// until free is called; lease tells of each Lease call.
type heldElsewhere struct {
	*journal.Memory
	mu    sync.Mutex
	freed bool
	lease chan struct{}
}

func (j *heldElsewhere) Lease(_ context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	select {
	case j.lease <- struct{}{}:
	default:
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.freed {
		return false, time.Now().Add(20 * time.Millisecond), nil
	}
	return true, time.Now().Add(ttl), nil
}

func (j *heldElsewhere) Release(context.Context, string, string) error { return nil }

func (j *heldElsewhere) free() {
	j.mu.Lock()
	j.freed = true
	j.mu.Unlock()
}

// A flight and a lease: a tap of an unfinished unnamed payment leads its
// flight and waits for the lease another machine holds while it finishes
// the payment; a second tap joins. The other machine records it done, the
// leader reads the record again and resends under its key (the replay).
// The second tap came while the payment was unfinished: it is that
// payment, and takes the replay, though the record is done by the time
// the flight lands (what a flight's reservation found first decides, not
// what came of it since).
func TestFlightJoinerOfALeaseWaitTakesTheFinishedAction(t *testing.T) {
	t.Parallel()
	const body = `{"amount":4400}`
	srv := newPayServer(t)
	j := &heldElsewhere{Memory: journal.NewMemory(), lease: make(chan struct{}, 1)}
	srv.commitThenDrop = map[int]bool{1: true}
	leftPending(t, j.Memory, post(t, context.Background(), srv.URL, body))
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	tr := transportOver(t, j)

	first := payAsync(tr, post(t, context.Background(), srv.URL, body))
	<-j.lease // the first tap found the payment pending, and waits for the lease
	second := payAsync(tr, post(t, context.Background(), srv.URL, body))
	awaitJoiners(t, tr, 1)
	done := recs[0]
	done.State, done.Status = journal.StateDone, http.StatusCreated
	require.NoError(t, j.Update(context.Background(), done)) // the other machine got its answer
	j.free()

	for _, p := range []paid{<-first, <-second} {
		require.NoError(t, p.err)
		assert.True(t, p.replay, "a tap of the unfinished payment was made a new one")
	}
	assert.Equal(t, 1, srv.chargeCount())
	assert.Len(t, srv.seen(), 2, "the second tap sent nothing of its own")
}

// A flight and a lease, handed over: a tap of an unfinished unnamed
// payment leads its flight and waits for the lease another machine holds
// while it finishes the payment; a second tap, with time to spare, joins.
// The other machine records the payment done, and the first tap's own
// context ends while it still waits. The second tap came while the payment
// was unfinished: it carries that payment on, under its key, and gets its
// replay; it is not a new payment.
func TestFlightHandedOverDuringALeaseWaitCarriesTheActionOn(t *testing.T) {
	t.Parallel()
	const body = `{"amount":4500}`
	srv := newPayServer(t)
	j := &heldElsewhere{Memory: journal.NewMemory(), lease: make(chan struct{}, 1)}
	srv.commitThenDrop = map[int]bool{1: true}
	leftPending(t, j.Memory, post(t, context.Background(), srv.URL, body))
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	tr := transportOver(t, j)

	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	defer cancelLeader()
	first := payAsync(tr, post(t, leaderCtx, srv.URL, body))
	<-j.lease // the first tap found the payment pending, and waits for the lease
	joinerCtx, cancelJoiner := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelJoiner()
	second := payAsync(tr, post(t, joinerCtx, srv.URL, body))
	awaitJoiners(t, tr, 1)
	done := recs[0]
	done.State, done.Status = journal.StateDone, http.StatusCreated
	require.NoError(t, j.Update(context.Background(), done)) // the other machine got its answer
	cancelLeader()
	require.ErrorIs(t, (<-first).err, context.Canceled)
	j.free()

	p := <-second
	require.NoError(t, p.err)
	assert.True(t, p.replay, "a tap of the unfinished payment was made a new one")
	assert.Equal(t, 1, srv.chargeCount(), "keys %v", keysOf(srv.seen()))
}

// A flight and a 307 hop: an unnamed payment is answered 307, and
// http.Client follows it; while the hop is at the server, a caller that
// does not follow redirects (a RoundTrip) sends the payment again: it goes
// out under the payment's key (the hop is unfinished), and the server is
// slow with its replay. A double tap through the http.Client joins that
// flight: made while the hop is still in flight (README, guarantee 2), it
// is the same payment, though the hop finishes before the flight lands;
// made once the hop has finished, it is a new payment.
func TestFlightJoiningAResendOfARedirectedPayment(t *testing.T) {
	t.Parallel()
	const body = `{"amount":7100}`
	for _, tc := range []struct {
		name      string
		afterHop  bool // the tap comes once the hop has finished
		charges   int
		tapReplay bool
	}{
		{"a tap while the hop is in flight is the payment", false, 1, true},
		{"a payment once the hop has finished is a new one", true, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			hopAt, releaseHop := make(chan struct{}), make(chan struct{})
			resendAt, releaseResend := make(chan struct{}), make(chan struct{})
			var hopOnce, resendOnce sync.Once
			defer hopOnce.Do(func() { close(releaseHop) })
			defer resendOnce.Do(func() { close(releaseResend) })
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				switch n {
				case 2: // the payment's hop
					close(hopAt)
					<-releaseHop
				case 3: // the resend, under the payment's key
					close(resendAt)
					<-releaseResend
				}
				if r.URL.Path != "/redir" {
					return false
				}
				w.Header().Set("Location", "/pay")
				w.WriteHeader(http.StatusTemporaryRedirect)
				return true
			}
			tr := transportOver(t, journal.NewMemory())
			client := &http.Client{Transport: tr}
			pay := func() <-chan paid {
				out := make(chan paid, 1)
				go func() {
					resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", body))
					if err != nil {
						out <- paid{err: err}
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					out <- paid{status: resp.StatusCode, body: string(b), replay: idemretry.IsReplay(resp), err: err}
				}()
				return out
			}
			payment := pay()
			<-hopAt
			resend := payAsync(tr, post(t, context.Background(), srv.URL+"/redir", body))
			<-resendAt
			if tc.afterHop {
				hopOnce.Do(func() { close(releaseHop) })
				require.NoError(t, (<-payment).err)
			}
			tap := pay()
			awaitJoiners(t, tr, 1)
			if !tc.afterHop {
				hopOnce.Do(func() { close(releaseHop) })
				require.NoError(t, (<-payment).err)
			}
			resendOnce.Do(func() { close(releaseResend) })

			r := <-resend
			require.NoError(t, r.err)
			assert.Equal(t, http.StatusTemporaryRedirect, r.status)
			keys := keysOf(srv.seen())
			assert.Equal(t, keys[0], keys[2], "the resend made while the hop was in flight went out under a key of its own")
			p := <-tap
			require.NoError(t, p.err)
			assert.Equal(t, tc.tapReplay, p.replay, "the tap's answer is the payment's replay")
			assert.Equal(t, tc.charges, srv.chargeCount(), "keys %v", keysOf(srv.seen()))
		})
	}
}

// A flight and a lease, outlasted: a tap of an unfinished unnamed payment
// leads its flight and waits for the lease another machine holds. That
// machine finishes the payment, then the user pays the same amount again
// there, deliberately: a new action, under a key of its own, which it
// charges and records done before it lets the lease go. The tap was of
// the first payment: it must never go out under the second one's key (and
// be answered with its charge).
func TestFlightLeaderWaitingForALeaseKeepsItsActionsKey(t *testing.T) {
	t.Parallel()
	const body = `{"amount":4600}`
	srv := newPayServer(t)
	j := &heldElsewhere{Memory: journal.NewMemory(), lease: make(chan struct{}, 1)}
	srv.commitThenDrop = map[int]bool{1: true}
	leftPending(t, j.Memory, post(t, context.Background(), srv.URL, body))
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	first := recs[0]
	tr := transportOver(t, j)

	tap := payAsync(tr, post(t, context.Background(), srv.URL, body))
	<-j.lease // the tap found the payment pending, and waits for the lease
	// The other machine: the first payment's answer, then a new one.
	done := first
	done.State, done.Status = journal.StateDone, http.StatusCreated
	require.NoError(t, j.Update(context.Background(), done))
	second := first
	second.Key, second.CreatedAt, second.Attempts = "7b0e2c1a-9d4f-4e8b-a6c3-5f1d2e3a4b5c", time.Now(), 0
	_, created, err := j.Reserve(context.Background(), second, journal.ReusePending)
	require.NoError(t, err)
	require.True(t, created, "the other machine's new payment replaces the done one")
	req := post(t, context.Background(), srv.URL, body)
	req.Header.Set("Idempotency-Key", second.Key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, `{"charge":"ch_2"}`, readAll(t, resp))
	second.State, second.Status, second.Attempts = journal.StateDone, http.StatusCreated, 1
	require.NoError(t, j.Update(context.Background(), second))
	j.free()

	p := <-tap
	if p.err == nil {
		assert.NotEqual(t, `{"charge":"ch_2"}`, p.body, "the tap of the first payment was answered with the second one's charge")
	}
	for i, s := range srv.seen()[2:] {
		assert.NotEqual(t, second.Key, s.Key, "request %d: the tap of the first payment went out under the second one's key", i+3)
	}
	assert.Equal(t, 2, srv.chargeCount())
}

// Resume resends an unnamed pending action whose record is now another
// key's, done (the first key reconciled and forgotten, the body paid
// since), and two taps of that body join Resume's flight while its Reserve
// is slow. Resume's reservation finds the done record and is refused
// (ErrNotResumable); the taps, a new payment, are one tap: paid once.
// Found in the review of the hand-on of a flight whose leader stopped
// before reserving (the claimer judged by its predecessor's record).
func TestFlightTapsOfAResendRefusedAsNotResumableArePaidOnce(t *testing.T) {
	t.Parallel()
	const body = `{"amount":10,"order":"U"}`
	srv := newPayServer(t)
	j := newStallingReserve(true)
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			hijackAndClose(w)
			return true
		}
		return false
	}
	leftPending(t, j, post(t, context.Background(), srv.URL, body))
	srv.mu.Lock()
	srv.script = nil
	srv.mu.Unlock()
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	tr := transportOver(t, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
	done := resumeAsync(ctx, tr, g, 1)
	<-g.rebuilding
	require.NoError(t, j.Forget(ctx, recs[0].ActionID)) // reconciled elsewhere
	roundTrip(t, tr, post(t, ctx, srv.URL, body))       // and paid again since
	before := srv.chargeCount()
	j.arm()
	close(g.gate)
	<-j.entered // Resume's request leads the flight, in its Reserve
	const taps = 2
	answers := make(chan string, taps)
	for range taps {
		go func() {
			resp, err := tr.RoundTrip(post(t, ctx, srv.URL, body))
			if err != nil {
				answers <- err.Error()
				return
			}
			answers <- fmt.Sprint(resp.StatusCode, " ", readAll(t, resp))
		}()
	}
	require.Eventually(t, func() bool { return idemretry.FlightJoiners(tr) == taps }, 5*time.Second, time.Millisecond)
	close(j.gate)
	res := (<-done).res
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, idemretry.ErrNotResumable)
	var got []string
	for range taps {
		got = append(got, <-answers)
	}
	require.Equal(t, before+1, srv.chargeCount(), "one double tap charged %d times: %q", srv.chargeCount()-before, got)
	require.Equal(t, got[0], got[1], "the taps were told different things")
}

// A joiner that carries its flight's action K on leads the successor,
// and its reservation finds K replaced (by machine B) with payment P: its
// boundTo refuses it, but reserve noted P as what the flight found
// (noteFound before boundTo), and N, a fresh tap of P that joined the
// flight, took the carrier's error, which names K: the refusal is the
// carrier's own, and N goes again. Found in review.
func TestFlightFreshJoinerIsNotGivenACarriersRefusal(t *testing.T) {
	// Not parallel: newTestTransport checks for goroutines left behind.
	srv := newPayServer(t)
	j := newStallingReserve(true)
	a, clk := newTestTransportOver(t, j, idemretry.WithDuplicateWindow(30*time.Second))
	b := transportOver(t, j, idemretry.WithClock(clk), idemretry.WithDuplicateWindow(30*time.Second))
	const body = `{"amount":34}`
	in, release := holdRequest(t, srv, 1)
	ctxL, cancelL := context.WithCancel(context.Background())
	l := payAsync(a, post(t, ctxL, srv.URL, body)) // L reserves K, request 1 held
	<-in
	x := payAsync(a, post(t, context.Background(), srv.URL, body))
	awaitJoiners(t, a, 1)
	j.arm()
	cancelL()
	require.Error(t, (<-l).err)
	<-j.entered // X, carrying K on, leads the successor: its reservation stalls
	release()
	k := roundTrip(t, b, post(t, context.Background(), srv.URL, body)) // K done, on B
	t.Logf("B's first: replay=%v", idemretry.IsReplay(k))
	clk.Advance(60 * time.Second)
	pp := roundTrip(t, b, post(t, context.Background(), srv.URL, body)) // P at 60 s, a new payment
	require.False(t, idemretry.IsReplay(pp))
	clk.Advance(10 * time.Second)
	n := payAsync(a, post(t, context.Background(), srv.URL, body)) // N at 70 s: a tap of P
	awaitJoiners(t, a, 1)
	close(j.gate)
	px, pn := <-x, <-n
	t.Logf("X: err=%v", px.err)
	t.Logf("N: err=%v replay=%v body=%s; charges=%d", pn.err, pn.replay, pn.body, srv.chargeCount())
	assert.NoError(t, pn.err, "N, a tap of P, was given the refusal of the request carrying K on")
}
