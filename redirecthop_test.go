package idemretry_test

import (
	"context"
	"fmt"
	"io"
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
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// A 307/308 hop of a keyed request (redirecthop.go): a sub-action with a
// key of its own, and a tap of the payment while its hop is in flight or
// pending, in this process or after a restart.

// The previous release paid "pay:H" through a 307: the parent is done (the
// 307), its hop "pay:H redirect:<8 bytes of the hop's fingerprint>" was
// charged by the redirect target and its answer lost. The upgraded app
// sends pay:H again (a named action is resent under its key): the
// parent's 307 comes back and the hop must go out under the hop's key, so
// that the target replays instead of charging again.
func TestUpgradeNamedRedirectHopKeepsItsKey(t *testing.T) {
	t.Parallel()
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path != "/redir" {
					return false
				}
				w.Header().Set("Location", "/pay")
				w.WriteHeader(http.StatusTemporaryRedirect)
				return true
			}
			srv.commitThenDrop = map[int]bool{1: true}
			const body = `{"order":"H","amount":1500}`
			const parentKey, hopKey = "0b7e4d8c-6a51-4a8e-9d4e-3f1f8e2d7c10", "7c2f1e9a-0d3b-4f6e-8a5c-1b2d3e4f5a60"
			hopFP := legacyFingerprint(http.MethodPost, srv.URL+"/pay", body)
			hopID := "pay:H redirect:" + fmt.Sprintf("%x", hopFP[:8])
			dir, fo, old := previousRelease(t, hashed)
			ctx := context.Background()
			parent := journal.Record{ActionID: "pay:H", Key: parentKey, Fingerprint: legacyFingerprint(http.MethodPost, srv.URL+"/redir", body),
				CreatedAt: time.Now(), State: journal.StatePending}
			_, _, err := old.Reserve(ctx, parent, journal.ReuseAny)
			require.NoError(t, err)
			parent.State, parent.Attempts, parent.Status = journal.StateDone, 1, http.StatusTemporaryRedirect
			require.NoError(t, old.Update(ctx, parent))
			_, _, err = old.Reserve(ctx, journal.Record{ActionID: hopID, Key: hopKey, Fingerprint: hopFP, CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
			require.NoError(t, err)
			chargeAndLose(t, srv.URL+"/pay", hopKey, body)
			require.NoError(t, old.Close())
			require.Equal(t, 1, srv.chargeCount())

			tr := upgraded(t, dir, fo)
			resp, err := (&http.Client{Transport: tr}).Do(post(t, idemretry.WithAction(ctx, "pay:H"), srv.URL+"/redir", body))
			require.NoError(t, err, "the upgraded app cannot resend pay:H")
			readAll(t, resp)
			reqs := srv.seen()
			assert.Equal(t, hopKey, reqs[len(reqs)-1].Key, "the hop went out under another key than the one it was charged under")
			assert.Equal(t, 1, srv.chargeCount(), "charged twice")
		})
	}
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

// http.Client follows a 307/308 for a POST by sending the same body, with
// the same context, to the new URL. That hop is a sub-action with a key of
// its own, stable across repeats: a resend of the whole action reuses both.
func TestRedirectHopIsSubAction(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t)
	c := &http.Client{Transport: tr}
	for range 2 {
		req := post(t, idemretry.WithAction(context.Background(), "pay:redirect"), srv.URL+"/old", "x")
		r, err := c.Do(req)
		require.NoError(t, err)
		readAll(t, r)
		assert.Equal(t, http.StatusCreated, r.StatusCode)
	}
	keys := keysOf(srv.seen())
	require.Len(t, keys, 4)
	assert.NotEqual(t, keys[0], keys[1], "the hop has its own key")
	assert.Equal(t, keys[:2], keys[2:], "and both keys are stable")
	assert.NotEmpty(t, keys[1])
	assert.Equal(t, 1, srv.chargeCount())
}

// A small named payment's redirect hop keeps the plain form (its id
// carries 8 bytes of its fingerprint, which every process must compute
// alike); after a restart the hop goes out again under its own key.
//
// Found in review hs1 (ebb2b86; was TestReviewHS1SmallNamedRedirectHop).
func TestRedirectHopOfASmallNamedAction(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/redir" {
			return false
		}
		w.Header().Set("Location", "/pay")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return true
	}
	srv.commitThenDrop = map[int]bool{2: true}
	id := "pay:hs1-hop"
	payload := smallNamedPayload(id, 1<<10)
	ctx := idemretry.WithAction(context.Background(), id)
	dir := t.TempDir()
	first, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = (&http.Client{Transport: first}).Do(post(t, ctx, srv.URL+"/redir", payload))
	require.Error(t, err)
	recs, err := first.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	hop := recs[0]
	require.True(t, strings.HasPrefix(hop.ActionID, id+" redirect:"), hop.ActionID)
	require.Equal(t, legacyFingerprint(http.MethodPost, srv.URL+"/pay", payload), hop.Fingerprint, "a hop keeps the plain form")
	require.NoError(t, first.Close())

	tr := upgraded(t, dir, nil)
	resp, err := (&http.Client{Transport: tr}).Do(post(t, ctx, srv.URL+"/redir", payload))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, 1, srv.chargeCount(), "charged twice")
	last := srv.seen()[len(srv.seen())-1]
	assert.Equal(t, hop.Key, last.Key, "the hop went out again under another key")
}

// hW1's review: an unnamed payment that the server redirects (307/308),
// tapped again while its hop is in flight.

// redirectingPayServer is a payServer whose /redir answers 307 to /pay,
// whose charges take delay.
func redirectingPayServer(t *testing.T, code int, delay time.Duration) *payServer {
	srv := newSlowPayServer(t, delay)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/redir" {
			return false
		}
		w.Header().Set("Location", "/pay")
		w.WriteHeader(code)
		return true
	}
	return srv
}

// Guarantee 2: a double tap is one payment, also unnamed ("an identical
// request while the first is in flight ... joins it"). The first tap's
// http.Client follows a 307 (or 308); the second tap, made while the
// first's hop is at the server, must not pay again.
//
// Found in review hw1 (03eab9b; was TestHW1UnnamedTapWhileTheHopIsInFlightIsOnePayment).
func TestRedirectHopTapInFlightIsOnePayment(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			srv := redirectingPayServer(t, code, 500*time.Millisecond)
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()))
			require.NoError(t, err)
			defer func() { require.NoError(t, tr.Close()) }()
			client := &http.Client{Transport: tr}

			first := make(chan error, 1)
			go func() {
				resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":7}`))
				if err == nil {
					resp.Body.Close()
				}
				first <- err
			}()
			require.Equal(t, 1, <-srv.arrived) // the parent
			require.Equal(t, 2, <-srv.arrived) // its hop, being charged
			resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":7}`))
			require.NoError(t, err)
			readAll(t, resp)
			require.NoError(t, <-first)
			assert.Equal(t, 1, srv.chargeCount(), "a double tap of one unnamed payment charged twice: keys %v", keysOf(srv.seen()))
		})
	}
}

// The other side of the same rule: once the hop has its final answer, the
// unnamed payment is finished, and an identical request is a deliberate
// repeat: a new payment under a new key. So is a repeat of a 307 the caller
// did not follow (a RoundTrip of its own): no hop, nothing unfinished.
//
// Found in review hw1 (03eab9b; was TestHW1UnnamedRepeatAfterTheHopFinishedIsANewPayment).
func TestRedirectHopRepeatAfterItFinishedIsANewPayment(t *testing.T) {
	t.Parallel()
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	client := &http.Client{Transport: tr}
	for range 2 {
		resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":7}`))
		require.NoError(t, err)
		readAll(t, resp)
		assert.False(t, idemretry.IsReplay(resp))
	}
	assert.Equal(t, 2, srv.chargeCount(), "a deliberate repeat after the first finished was not charged")

	// Not followed: the 307 is the answer.
	keys := map[string]bool{}
	for range 2 {
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL+"/redir", `{"amount":8}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
		readAll(t, resp)
		keys[resp.Request.Header.Get("Idempotency-Key")] = true
	}
	assert.Len(t, keys, 2, "a deliberate repeat of an unfollowed 307 reused the key")
}

// The hop's answer was lost (the server charged, then cut the connection):
// the hop is pending, and so is the payment. An identical request, in the
// same process or after a restart on the same journal, is a tap of it: it
// goes out under the parent's key, follows to the hop under the hop's key,
// and the server replays the charge instead of charging again.
//
// Found in review hw1 (03eab9b; was TestHW1UnnamedTapOfAPaymentWhoseHopIsPendingIsOnePayment).
func TestRedirectHopTapWhilePendingIsOnePayment(t *testing.T) {
	t.Parallel()
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "same process", true: "after a restart"}[restart], func(t *testing.T) {
			srv := redirectingPayServer(t, http.StatusPermanentRedirect, 0)
			srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
			dir := t.TempDir()
			open := func() *idemretry.Transport {
				// No keep-alive: net/http would resend the hop on a reused connection.
				tr, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
				require.NoError(t, err)
				return tr
			}
			tr := open()
			_, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
			require.Error(t, err, "the hop's answer was lost")
			require.Equal(t, 1, srv.chargeCount())
			if restart {
				require.NoError(t, tr.Close())
				tr = open()
			}
			defer func() { require.NoError(t, tr.Close()) }()
			resp, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
			require.NoError(t, err)
			readAll(t, resp)
			assert.Equal(t, 1, srv.chargeCount(), "the tap of a payment whose hop is pending charged again: keys %v", keysOf(srv.seen()))
			assert.True(t, idemretry.IsReplay(resp), "the tap was not answered with the charge's replay")
			un, err := tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, un, "the hop's replay was not recorded")
		})
	}
}

// hW3's review of the 307/308 hop of an unnamed payment (hW1's fix):
// what hopUnfinished takes for an unfinished hop.

// hopFlakyJournal fails the update of a 307/308 hop's done while failHop
// is set: the journal (a database whose connection was cut, a full disk)
// did not take it, and the Transport keeps the outcome in memory.
type hopFlakyJournal struct {
	*journal.Memory
	failHop atomic.Bool
}

func (j *hopFlakyJournal) Update(ctx context.Context, rec journal.Record) error {
	if j.failHop.Load() && rec.State == journal.StateDone && strings.Contains(rec.ActionID, " redirect:") {
		return errDiskGone
	}
	return j.Memory.Update(ctx, rec)
}

// Guarantee 2: once the hop has its final answer, an identical request is
// a deliberate repeat: a new payment. The hop's done did not reach the
// journal at once (the Transport holds it, to write before the hop is sent
// again); the journal then heals. The repeat must be a new payment, not a
// tap of a hop the journal still lists as pending, answered with the first
// payment's replay and charged nothing.
//
// Found in review hw3 (a2bb679; was TestHW3RepeatAfterAHopWhoseDoneIsUnlandedIsANewPayment).
func TestRedirectHopRepeatAfterAnUnlandedDoneIsANewPayment(t *testing.T) {
	t.Parallel()
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	j := &hopFlakyJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j)
	client := &http.Client{Transport: tr}

	j.failHop.Store(true)
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 1, srv.chargeCount())

	j.failHop.Store(false) // the journal heals
	resp, err = client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	assert.False(t, idemretry.IsReplay(resp), "the deliberate repeat was answered with the first payment's replay")
	assert.Equal(t, 2, srv.chargeCount(), "a deliberate repeat after the first payment finished was not charged: keys %v", keysOf(srv.seen()))
}

// Guarantee 3: a hop whose outcome is unknown (the server refused its key
// as used with another payload) is never sent again, under its key or a
// new one: an identical request is not a new payment either.
//
// Found in review hw3 (a2bb679; was TestHW3RepeatOfAPaymentWhoseHopIsUnknownIsNotPaid).
func TestRedirectHopUnknownRepeatIsNotPaid(t *testing.T) {
	t.Parallel()
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	script := srv.script
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 2 { // the hop: refused as a key reused
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"type":"idempotency_error"}}`))
			return true
		}
		return script(n, w, r)
	}
	tr := transportOver(t, journal.NewMemory())
	client := &http.Client{Transport: tr}
	_, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":6}`))
	require.ErrorIs(t, err, idemretry.ErrKeyReused)
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":6}`))
	if err == nil {
		readAll(t, resp)
	}
	assert.Error(t, err, "a payment whose hop's outcome is unknown was sent again")
	assert.Zero(t, srv.chargeCount(), "keys %v", keysOf(srv.seen()))
}

// A hop to another host, tapped while in flight, with taps that all arrive
// at once, and with a duplicate window that has passed: one payment.
//
// Found in review hw3 (a2bb679; was TestHW3TapsWhileAHopToAnotherHostIsInFlight).
func TestRedirectHopToAnotherHostTapsInFlight(t *testing.T) {
	t.Parallel()
	for _, dw := range []time.Duration{0, time.Nanosecond} {
		t.Run(dw.String(), func(t *testing.T) {
			pay := newSlowPayServer(t, 400*time.Millisecond)
			front := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Location", pay.URL+"/pay")
				w.WriteHeader(http.StatusTemporaryRedirect)
			})
			tr := transportOver(t, journal.NewMemory(), idemretry.WithDuplicateWindow(dw))
			client := &http.Client{Transport: tr}
			do := func() error {
				resp, err := client.Do(post(t, context.Background(), front.URL+"/redir", `{"amount":3}`))
				if err == nil {
					readAll(t, resp)
				}
				return err
			}
			first := make(chan error, 1)
			go func() { first <- do() }()
			require.Equal(t, 1, <-pay.arrived)
			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() { defer wg.Done(); assert.NoError(t, do()) }()
			}
			wg.Wait()
			require.NoError(t, <-first)
			assert.Equal(t, 1, pay.chargeCount(), "taps while the hop was in flight charged again: keys %v", keysOf(pay.seen()))
		})
	}
}

// README, guarantee 2: "an identical request while the hop is in flight in
// the Transport, or pending in the journal (also after a restart), goes
// out under the parent's key and joins the hop"; not covered "after a
// restart, a journal that hashes action ids". In the same process, on a
// journal that hashes ids, the hop whose answer was lost is pending: the
// tap must not pay again.
//
// Found in review hw3 (a2bb679; was TestHW3TapOfAPendingHopOnAHashingJournalSameProcess).
func TestRedirectHopTapWhilePendingOnAHashingJournal(t *testing.T) {
	t.Parallel()
	srv := redirectingPayServer(t, http.StatusPermanentRedirect, 0)
	srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
	fj, err := filejournal.Open(t.TempDir(), filejournal.WithHashedIDs())
	require.NoError(t, err)
	defer fj.Close()
	// No keep-alive: net/http would resend the hop on a reused connection.
	tr, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournal(fj), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	client := &http.Client{Transport: tr}
	_, err = client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
	require.Error(t, err, "the hop's answer was lost")
	require.Equal(t, 1, srv.chargeCount())
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, 1, srv.chargeCount(), "the tap of a payment whose hop is pending charged again: keys %v", keysOf(srv.seen()))
}

// hopResumer rebuilds the hop of a redirected payment: POST body to url.
type hopResumer struct{ url, body string }

func (h hopResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader(h.body))
}

func (h hopResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// After a restart, Resume resends the hop left pending; an identical
// request made while it is in flight is a tap of the payment: it joins the
// resumed hop, and nothing is charged again.
//
// Found in review hw3 (a2bb679; was TestHW3TapWhileResumeResendsThePendingHop).
func TestRedirectHopTapWhileResumeResendsIt(t *testing.T) {
	t.Parallel()
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
	tapArrived := make(chan struct{})
	script := srv.script
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		switch n {
		case 3: // the resumed hop: held until the tap's parent is at the server
			<-tapArrived
			time.Sleep(50 * time.Millisecond)
		case 4:
			close(tapArrived)
		}
		return script(n, w, r)
	}
	dir := t.TempDir()
	open := func() *idemretry.Transport {
		tr, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
		require.NoError(t, err)
		return tr
	}
	tr := open()
	_, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":4}`))
	require.Error(t, err, "the hop's answer was lost")
	require.NoError(t, tr.Close())
	tr = open()
	defer func() { require.NoError(t, tr.Close()) }()
	done := resumeAsync(context.Background(), tr, hopResumer{srv.URL + "/pay", `{"amount":4}`}, 1)
	require.Equal(t, 1, <-srv.arrived)
	require.Equal(t, 2, <-srv.arrived)
	require.Equal(t, 3, <-srv.arrived) // the resumed hop, held
	resp, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":4}`))
	require.NoError(t, err)
	readAll(t, resp)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, 1, srv.chargeCount(), "keys %v", keysOf(srv.seen()))
	assert.True(t, idemretry.IsReplay(resp))
	assert.Len(t, srv.seen(), 4, "the tap's hop joined the resumed one: nothing more sent")
}

// A large named payment through a 307 (http.Client follows it): the parent
// has a keyed fingerprint, its hop a plain one (8 of its bytes name it).
// The hop is charged and its answer lost; the app restarts on the file
// journal and pays again: the hop must go out under the key it was
// charged under (guarantee 2), and a second tap while the hop is in the
// air must not charge again.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedRedirectHopKeepsItsKeyAcrossRestart).
func TestRedirectHopOfALargeNamedActionKeepsItsKeyAcrossRestart(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/redir" {
			return false
		}
		w.Header().Set("Location", "/pay")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return true
	}
	srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
	payload := largePayload("RD-1")
	ctx := idemretry.WithAction(context.Background(), "pay:RD-1")
	dir := t.TempDir()
	// No keep-alive: net/http would resend the hop on a reused connection.
	first, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = (&http.Client{Transport: first}).Do(post(t, ctx, srv.URL+"/redir", payload))
	require.Error(t, err, "the hop's answer was lost")
	recs, err := first.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1, "the hop is pending")
	hop := recs[0]
	require.True(t, strings.HasPrefix(hop.ActionID, "pay:RD-1 redirect:"), hop.ActionID)
	require.NotEqual(t, keyedPrefix, hop.Fingerprint[:4], "a hop keeps the plain form")
	require.NoError(t, first.Close())
	require.Equal(t, 1, srv.chargeCount())

	tr := upgraded(t, dir, nil)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := (&http.Client{Transport: tr}).Do(post(t, ctx, srv.URL+"/redir", payload))
			if errs[i] = err; err == nil {
				readAll(t, resp)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "tap %d", i)
	}
	assert.Equal(t, 1, srv.chargeCount(), "charged twice")
	n := 0
	for _, r := range srv.seen()[2:] {
		if r.Key == hop.Key {
			n++
		}
	}
	assert.NotZero(t, n, "the hop went out again under another key")
}

// corruptHopJournal is a Memory whose Unfinished names every record of a
// 307/308 hop, and "pay:other", corrupt (a *journal.CorruptRecordsError
// beside the list): a journal with damaged records, some of them hops'.
type corruptHopJournal struct{ *journal.Memory }

func (j corruptHopJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Memory.Unfinished(ctx)
	if err != nil {
		return nil, err
	}
	ce := &journal.CorruptRecordsError{IDs: []string{"pay:other"}}
	var intact []journal.Record
	for _, r := range recs {
		if strings.Contains(r.ActionID, " redirect:") {
			ce.IDs = append(ce.IDs, r.ActionID)
			continue
		}
		intact = append(intact, r)
	}
	return intact, fmt.Errorf("damaged: %w", ce)
}

// Where a corrupt record meets an unnamed payment answered 307: one of
// another action does not hold it up (a repeat after its hop finished is a
// new payment), and one of its own hop, whose outcome the journal cannot
// tell, keeps a repeat a tap of it (under the parent's key and the hop's:
// the server replays, nothing is charged again), never a new payment.
// Before, hopUnfinished failed on the CorruptRecordsError as on any error:
// every such repeat failed with journal.ErrCorruptRecord while any record
// of the journal was damaged.
func TestRedirectHopRepeatBesideACorruptRecord(t *testing.T) {
	t.Parallel()
	t.Run("another action's", func(t *testing.T) {
		srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
		client := &http.Client{Transport: transportOver(t, corruptHopJournal{journal.NewMemory()})}
		for i := range 2 {
			resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
			require.NoError(t, err, "payment %d", i+1)
			readAll(t, resp)
		}
		assert.Equal(t, 2, srv.chargeCount(), "a deliberate repeat after the first finished was not charged")
	})
	t.Run("its hop's", func(t *testing.T) {
		srv := redirectingPayServer(t, http.StatusPermanentRedirect, 0)
		srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt: charged, answer lost
		// No keep-alive: net/http would resend the hop on a reused connection.
		tr, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true},
			idemretry.WithJournal(corruptHopJournal{journal.NewMemory()}), idemretry.WithMaxRetries(0))
		require.NoError(t, err)
		defer tr.Close()
		client := &http.Client{Transport: tr}
		_, err = client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
		require.Error(t, err, "the hop's answer was lost")
		resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
		require.NoError(t, err, "the tap")
		readAll(t, resp)
		assert.True(t, idemretry.IsReplay(resp), "the tap was not answered with the charge's replay")
		assert.Equal(t, 1, srv.chargeCount(), "a repeat of a payment whose hop's record is damaged charged again: keys %v", keysOf(srv.seen()))
	})
}
