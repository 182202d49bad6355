package idemretry_test

// The key of an action named with WithAction when its requests carry keys
// of their own, as an SDK that mints one per call (stripe-go) sets them:
// the action adopts the key its first request carries (or mints one), and
// every later request of it goes out under that journaled key, restarts
// included, whatever key it carries. (Issue 29 item 1: the request's key
// named the action, so an SDK's new key after a restart was a new payment.)

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// sdkPost is a POST of body under action id, with the key an SDK would set
// on it.
func sdkPost(t *testing.T, id, key, url, body string) *http.Request {
	t.Helper()
	req := post(t, idemretry.WithAction(context.Background(), id), url, body)
	req.Header.Set("Idempotency-Key", key)
	return req
}

// The first request of a named action goes out with the key it carries,
// unchanged, and the journal holds that key under the action's id, not
// under the key.
func TestNamedActionAdoptsRequestKey(t *testing.T) {
	srv := newPayServer(t)
	tr, j, _ := newTestTransport(t)
	roundTrip(t, tr, sdkPost(t, "pay:adopt", "sdk-key-1", srv.URL, `{"amount":1}`))
	assert.Equal(t, []string{"sdk-key-1"}, keysOf(srv.seen()))
	rec, found, err := j.Get(context.Background(), "pay:adopt")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "sdk-key-1", rec.Key)
	_, found, err = j.Get(context.Background(), "key:sdk-key-1")
	require.NoError(t, err)
	assert.False(t, found, "the request's key named an action of its own")
}

// A named action whose charge's answer was lost, sent again by a new
// Transport over its journal (a restart) with a new key from the SDK, goes
// out under its first key and gets the server's replay; so does a third
// call, with yet another key, once the action is done. The key replaced is
// logged at Debug, and nothing above it.
func TestNamedActionKeyAcrossRestart(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	_, err := first.RoundTrip(sdkPost(t, "pay:restart", "sdk-key-1", srv.URL, `{"amount":1}`))
	require.Error(t, err, "the answer was lost")

	var logs bytes.Buffer
	second, _ := newTestTransportOver(t, j,
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	for _, key := range []string{"sdk-key-2", "sdk-key-3"} {
		resp := roundTrip(t, second, sdkPost(t, "pay:restart", key, srv.URL, `{"amount":1}`))
		assert.True(t, idemretry.IsReplay(resp), "sent with %s", key)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	assert.Equal(t, []string{"sdk-key-1", "sdk-key-1", "sdk-key-1"}, keysOf(srv.seen()))
	assert.Equal(t, 1, srv.chargeCount())
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 2, "%s", logs.String())
	for i, l := range lines {
		assert.Contains(t, l, `level=DEBUG msg="idemretry: the request's key replaced by its action's" action=pay:restart key=sdk-key-1 request_key=sdk-key-`+fmt.Sprint(i+2))
	}
}

// Another payload under a named action's id is refused before sending,
// whatever key it carries; the error names the action's key.
func TestNamedActionOtherPayloadRefused(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	roundTrip(t, tr, sdkPost(t, "pay:other", "sdk-key-1", srv.URL, `{"amount":1}`))
	err := sendErr(tr, sdkPost(t, "pay:other", "sdk-key-2", srv.URL, `{"amount":999}`))
	require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "pay:other", ae.Action)
	assert.Equal(t, "sdk-key-1", ae.Key)
	assert.Len(t, srv.seen(), 1, "the other payload was not sent")
}

// Requests of one named action from several goroutines, each with a key of
// its own (one SDK call object each), are one flight: one request, under
// the first one's key, and each caller gets the answer.
func TestNamedActionOneFlightAcrossRequestKeys(t *testing.T) {
	srv := newPayServer(t)
	arrived, release := holdRequest(t, srv, 1)
	tr, _, _ := newTestTransport(t)
	var results []<-chan paid
	results = append(results, payAsync(tr, sdkPost(t, "pay:flight", "sdk-key-1", srv.URL, `{"amount":1}`)))
	<-arrived
	for _, key := range []string{"sdk-key-2", "sdk-key-3"} {
		results = append(results, payAsync(tr, sdkPost(t, "pay:flight", key, srv.URL, `{"amount":1}`)))
	}
	awaitJoiners(t, tr, 2)
	release()
	for i, r := range results {
		p := <-r
		require.NoError(t, p.err, "caller %d", i+1)
		assert.Equal(t, paid{status: http.StatusCreated, body: `{"charge":"ch_1"}`}, p, "caller %d", i+1)
	}
	reqs := srv.requireOnePayment(t, 1)
	assert.Equal(t, "sdk-key-1", reqs[0].Key, "the first caller's key")
}

// A 307/308 hop of a named action carries the key http.Client copies to it
// from the caller's request, adopted as the hop's first key as its parent
// adopted it; after a restart, with a new key from the SDK, both the parent
// and the unfinished hop go out under their journaled keys, and the hop's
// charge is replayed, not made again.
func TestNamedActionRedirectHopKey(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/old" {
			// On a connection of its own, the hop's lost answer is not
			// resent by net/http itself (a request with an
			// Idempotency-Key is, on a reused connection).
			w.Header().Set("Connection", "close")
			http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
			return true
		}
		return false
	}
	srv.commitThenDrop[2] = true // the hop's charge: answer lost
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	_, err := (&http.Client{Transport: first}).Do(sdkPost(t, "pay:hop", "sdk-key-1", srv.URL+"/old", `{"amount":1}`))
	require.Error(t, err, "the hop's answer was lost")

	second, _ := newTestTransportOver(t, j)
	resp, err := (&http.Client{Transport: second}).Do(sdkPost(t, "pay:hop", "sdk-key-2", srv.URL+"/old", `{"amount":1}`))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.True(t, idemretry.IsReplay(resp))
	assert.Equal(t, []string{"sdk-key-1", "sdk-key-1", "sdk-key-1", "sdk-key-1"}, keysOf(srv.seen()))
	assert.Equal(t, 1, srv.chargeCount())
}

// Resume sends a named action under its listed key, whatever key the
// rebuilt request carries.
func TestResumeListedKeyWinsOverRequestKey(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	_, err := first.RoundTrip(sdkPost(t, "pay:resume", "sdk-key-1", srv.URL, `{"amount":1}`))
	require.Error(t, err, "the answer was lost")

	second, _ := newTestTransportOver(t, j)
	results, err := second.Resume(context.Background(), keyedResumer{url: srv.URL, key: "sdk-key-2", body: `{"amount":1}`}, 1)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.NoError(t, results[0].Err)
	assert.True(t, results[0].Sent)
	assert.Equal(t, []string{"sdk-key-1", "sdk-key-1"}, keysOf(srv.seen()))
	assert.Equal(t, 1, srv.chargeCount())
}

// keyedResumer rebuilds every action as a POST of body with a key of its
// own, as a request built by an SDK would carry.
type keyedResumer struct{ url, key, body string }

func (r keyedResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(r.body))
	if err == nil {
		req.Header.Set("Idempotency-Key", r.key)
	}
	return req, err
}

func (keyedResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// One key on two named actions is two actions here, each adopting it as
// its first key, and one key to the server, which judges the second
// payload: Stripe refuses it (400 idempotency_error), which is
// ErrKeyReused.
func TestOneKeyUnderTwoActions(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n != 2 {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`)
		return true
	}
	tr, _, _ := newTestTransport(t)
	roundTrip(t, tr, sdkPost(t, "pay:A", "order-42", srv.URL, "amount=1"))
	err := sendErr(tr, sdkPost(t, "pay:B", "order-42", srv.URL, "amount=999"))
	require.ErrorIs(t, err, idemretry.ErrKeyReused)
	assert.Equal(t, []string{"order-42", "order-42"}, keysOf(srv.seen()))
	assert.Equal(t, 1, srv.chargeCount())
}

// A process whose crypto/rand.Reader fails (replaced, or a legacy Linux
// without getrandom whose /dev/urandom cannot be opened) gets an error from
// RoundTrip, not a crash: minting a key must not take the process down.
//
// Found in the review of the attempt context (a684ae8; was TestReviewCtxFailingRandReaderIsAnErrorNotACrash).
func TestKeyFromAFailingRandReaderIsAnErrorNotACrash(t *testing.T) {
	t.Parallel()
	if childtest.IsChild() {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
		}))
		defer srv.Close()
		tr, err := idemretry.NewTransport(&http.Transport{}, inMemory())
		require.NoError(t, err)
		defer tr.Close()
		rand.Reader = failingReader{}
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rand"), srv.URL, `{"amount":1}`))
		if err == nil {
			resp.Body.Close()
		}
		fmt.Println("RoundTrip returned:", err)
		return
	}
	cmd := childtest.Command("TestKeyFromAFailingRandReaderIsAnErrorNotACrash")
	out, err := cmd.CombinedOutput()
	first := strings.SplitN(string(out), "\n", 2)[0]
	require.NoError(t, err, "the child process crashed: %s", first)
}

// I2 across a restart: a new Transport over the same journal resends the
// unfinished action with the same key.
func TestSameKeyAfterRestart(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), "pay:restart")
	_, err := first.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.Error(t, err, "the answer was lost")

	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, un, 1)
	assert.Equal(t, "pay:restart", un[0].ActionID)

	second, _ := newTestTransportOver(t, j)
	resp, err := second.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	assert.True(t, idemretry.IsReplay(resp))
	readAll(t, resp)
	srv.requireOnePayment(t, 2)
}

// An explicit action keeps its key after it is done: a repeat is replayed.
func TestExplicitActionKeepsKeyAfterDone(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:again")
	for range 2 {
		roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
	}
	srv.requireOnePayment(t, 2)
}

// A key the caller set is kept as is, bare or quoted; a bad one is refused.
func TestCallerSuppliedKey(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	for _, v := range []string{"order-77-attempt", `"order-77-attempt"`} {
		req := post(t, context.Background(), srv.URL, "x")
		req.Header.Set("Idempotency-Key", v)
		roundTrip(t, tr, req)
	}
	assert.Equal(t, []string{"order-77-attempt", "order-77-attempt"}, keysOf(srv.seen()))

	for _, bad := range []string{strings.Repeat("k", 256), "has space", "caf\u00e9", `""`} {
		req := post(t, context.Background(), srv.URL, "x")
		req.Header.Set("Idempotency-Key", bad)
		_, err := tr.RoundTrip(req)
		assert.ErrorIs(t, err, idemretry.ErrInvalidKey, bad)
	}
	assert.Len(t, srv.seen(), 2)
}

// The IETF draft's form: a quoted Structured Field string.
func TestQuotedKeyOption(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithQuotedKey())
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	k := srv.seen()[0].Key
	require.True(t, strings.HasPrefix(k, `"`) && strings.HasSuffix(k, `"`), k)
	assert.NoError(t, uuidCheck(strings.Trim(k, `"`)))
}

// I8 for caller keys: without a WithAction id the key names the action, so
// a key already used for one payload refuses another before sending. (With
// one, the id names it: TestOneKeyUnderTwoActions.)
func TestCallerKeyNamesTheAction(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	var errs []error
	for _, body := range []string{"amount=1", "amount=999"} {
		req := post(t, context.Background(), srv.URL, body)
		req.Header.Set("Idempotency-Key", "order-42")
		err := sendErr(tr, req)
		errs = append(errs, err)
	}
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], idemretry.ErrFingerprintMismatch)
	assert.Len(t, srv.seen(), 1, "the second payload was not sent")
}

// Issue 7, item 7: a caller key set under a non-canonical header name is the
// request's key: one Idempotency-Key value goes out, the caller's.
func TestLowerCaseCallerKeyHeader(t *testing.T) {
	var got [][]string
	var mu sync.Mutex
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(201)
	})
	tr, j, _ := newTestTransport(t)
	req := post(t, context.Background(), srv.URL, `{"amount":2}`)
	req.Header["idempotency-key"] = []string{"order-77-pay"}
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, got, 1)
	assert.Equal(t, []string{"order-77-pay"}, got[0], "the request left with these Idempotency-Key values")
	rec, created, err := j.Reserve(context.Background(), journal.Record{ActionID: "key:order-77-pay", Key: "x", CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
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

// WithRequireAction: a keyed request that names no action is refused before
// anything is sent; a named one, a caller key, and an unkeyed GET go out.
func TestRequireAction(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithRequireAction())
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	require.ErrorIs(t, err, idemretry.ErrActionRequired)
	assert.Empty(t, srv.seen())

	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	req := post(t, context.Background(), srv.URL, `{"amount":2}`)
	req.Header.Set("Idempotency-Key", "caller-key-2")
	resp, err = tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	resp, err = tr.RoundTrip(httptestGet(t, srv.URL))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Len(t, srv.seen(), 3)
}

// WithDuplicateWindow: an identical unnamed request within the window of the
// first is the same action (same key, the server replays); after it, a new
// one.
func TestDuplicateWindow(t *testing.T) {
	srv := newPayServer(t)
	tr, _, clk := newTestTransport(t, idemretry.WithDuplicateWindow(30*time.Second))
	send := func() *http.Response {
		resp := roundTrip(t, tr, post(t, context.Background(), srv.URL, `{"amount":30}`))
		return resp
	}
	send()
	clk.Advance(10 * time.Second)
	second := send()
	assert.True(t, idemretry.IsReplay(second), "a repeat within the window is answered with the replay")
	assert.Equal(t, 1, srv.chargeCount())
	clk.Advance(25 * time.Second)
	send()
	assert.Equal(t, 2, srv.chargeCount(), "a repeat after the window is a new payment")
	keys := keysOf(srv.seen())
	require.Len(t, keys, 3)
	assert.Equal(t, keys[0], keys[1])
	assert.NotEqual(t, keys[1], keys[2])

	_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithDuplicateWindow(-time.Second))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
	_, err = idemretry.NewTransport(nil, inMemory(), idemretry.WithDuplicateWindow(48*time.Hour))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
}

// A tap within the duplicate window after the wall clock was set back
// (by NTP, by the user) is never a second payment: without a journal that
// keeps time, a payment that looks made after the tap arrived may be a
// clock set back since, and the window's safe side is the tap (here, set
// back 5 minutes, its key looks made in the clock's future: refused). The simulator found the
// rule that a payment made after the request is not repeated breaking it
// (a clock set back 5 minutes, a double charge).
func TestDuplicateWindowTapAfterTheClockWasSetBack(t *testing.T) {
	// Not parallel: newTestTransport checks for goroutines left behind.
	srv := newPayServer(t)
	tr, _, clk := newTestTransport(t, idemretry.WithDuplicateWindow(30*time.Second))
	const body = `{"amount":36}`
	roundTrip(t, tr, post(t, context.Background(), srv.URL, body))
	clk.Advance(-5 * time.Minute)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
	if err == nil {
		readAll(t, resp)
		assert.True(t, idemretry.IsReplay(resp), "a tap after the clock was set back was made a new payment")
	} else {
		// Its key looks made in the clock's future: nothing is sent.
		assert.ErrorIs(t, err, idemretry.ErrClockSkew)
	}
	assert.Equal(t, 1, srv.chargeCount(), "a tap after the clock was set back was charged again")
}

// keptTime is a journal that keeps a time that never goes back
// (journal.Timekeeper), read off clk.
type keptTime struct {
	*stallingReserve
	clk *fakeClock
}

func (k *keptTime) Now() time.Time { return k.clk.Now() }

// The duplicate window is judged when the tap arrives, not when its
// reservation runs: a tap 20 s after the first payment, under a 30 s
// window, whose Reserve is slow while the clock moves on to 40 s (a slow
// journal, a clock set forward), is the first payment's tap: its replay,
// no second charge. The simulator found it with a clock set forward
// during a slow Reserve.
func TestDuplicateWindowIsJudgedWhenTheTapArrives(t *testing.T) {
	// Not parallel: newTestTransport checks for goroutines left behind.
	srv := newPayServer(t)
	j := newStallingReserve(true)
	tr, clk := newTestTransportOver(t, j, idemretry.WithDuplicateWindow(30*time.Second))
	const body = `{"amount":31}`
	roundTrip(t, tr, post(t, context.Background(), srv.URL, body))
	clk.Advance(20 * time.Second)
	j.arm()
	tap := payAsync(tr, post(t, context.Background(), srv.URL, body))
	<-j.entered
	clk.Advance(20 * time.Second) // 40 s after the first payment
	close(j.gate)
	p := <-tap
	require.NoError(t, p.err)
	assert.True(t, p.replay, "a tap within the window, reserved after it, was made a new payment")
	assert.Equal(t, 1, srv.chargeCount())
}

// An unnamed request that arrived at 60 s (the first payment, at 0, is
// past the 30 s window: it is a new payment) and reserves only later finds
// a payment another machine made at 360 s, five minutes after it arrived:
// it is not a tap of that one, made after it. Found in the review of the
// window judged at arrival (repeats had no lower bound).
func TestDuplicateWindowDoesNotReachAPaymentMadeAfterTheRequest(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	clk := newFakeClock()
	j := &keptTime{newStallingReserve(true), clk} // a journal that keeps time, as the file journal and sqljournal do
	a := transportOver(t, j, idemretry.WithClock(clk), idemretry.WithDuplicateWindow(30*time.Second))
	b := transportOver(t, j, idemretry.WithClock(clk), idemretry.WithDuplicateWindow(30*time.Second))
	const body = `{"amount":32}`
	roundTrip(t, a, post(t, context.Background(), srv.URL, body)) // O at 0
	clk.Advance(60 * time.Second)
	j.arm()
	r1 := payAsync(a, post(t, context.Background(), srv.URL, body)) // arrives at 60: a new payment
	<-j.entered
	clk.Advance(5 * time.Minute)
	q := roundTrip(t, b, post(t, context.Background(), srv.URL, body)) // Q at 360, on machine B: a new payment
	require.False(t, idemretry.IsReplay(q))
	close(j.gate)
	p := <-r1
	require.NoError(t, p.err)
	assert.False(t, p.replay, "a request that arrived 5 min before payment Q was given Q's answer")
	assert.Equal(t, 3, srv.chargeCount(), "three intents (0 s, 60 s, 360 s), each outside the others' 30 s window")
}

// R1 arrives at 35 s (O, at 0, past the 30 s window: a
// new payment) and joins the flight of L (arrived at 25 s: a tap of O),
// whose replay is slow; meanwhile machine B makes payment Q at 200 s. At
// 500 s L lands; R1 goes again, leads the successor, finds Q and, judging
// by its arrival (35 s < 200 s + 30 s) alone, it took Q's answer; Q was
// made after it arrived, so it is a payment of its own. Found in the
// review of the window judged at arrival.
func TestDuplicateWindowOfAJoinerGoneAgainDoesNotReachALaterPayment(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	clk := newFakeClock()
	j := &keptTime{newStallingReserve(true), clk} // a journal that keeps time, as the file journal and sqljournal do
	a := transportOver(t, j, idemretry.WithClock(clk), idemretry.WithDuplicateWindow(30*time.Second))
	b := transportOver(t, j, idemretry.WithClock(clk), idemretry.WithDuplicateWindow(30*time.Second))
	const body = `{"amount":33}`
	roundTrip(t, a, post(t, context.Background(), srv.URL, body)) // O at 0, request 1
	in, release := holdRequest(t, srv, 2)
	clk.Advance(25 * time.Second)
	l := payAsync(a, post(t, context.Background(), srv.URL, body)) // L: a tap of O, request 2, held
	<-in
	clk.Advance(10 * time.Second)
	r1 := payAsync(a, post(t, context.Background(), srv.URL, body)) // R1 at 35 s: a new payment
	awaitJoiners(t, a, 1)
	clk.Advance(165 * time.Second)
	q := roundTrip(t, b, post(t, context.Background(), srv.URL, body)) // Q at 200 s on B
	require.False(t, idemretry.IsReplay(q))
	clk.Advance(300 * time.Second)
	release()
	pl := <-l
	require.NoError(t, pl.err)
	require.True(t, pl.replay)
	p := <-r1
	require.NoError(t, p.err)
	t.Logf("R1: replay=%v body=%s; charges=%d", p.replay, p.body, srv.chargeCount())
	assert.False(t, p.replay, "R1 (arrived 35 s) was given the answer to Q, paid 165 s after it arrived")
	assert.Equal(t, 3, srv.chargeCount())
}

// WithAction ids that are empty or look like derived ids are refused.
func TestInvalidActionIDs(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	for _, id := range []string{"", "key:order-1", "fp:abc"} {
		_, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), id), srv.URL, "x"))
		assert.ErrorIs(t, err, idemretry.ErrInvalidAction, "%q", id)
	}
	assert.Empty(t, srv.seen())
}

// A request of a named action that carries a key idemretry cannot use
// (two Idempotency-Key headers, one too long) is refused before anything
// is sent, as a request of that action: after the action's first request
// was charged and its answer lost, the refusal says it may have been
// performed, with its key and attempts, never that nothing of it reached
// the server; of an action never sent, it says nothing did. (Refused as an
// unnamed request's invalid key, with MaybeProcessed false, the app could
// make the charged payment a new one.)
func TestNamedActionInvalidRequestKeyRefusedAsTheAction(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	tr, j, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	_, err := tr.RoundTrip(sdkPost(t, "pay:bad-key", "sdk-key-1", srv.URL, `{"amount":1}`))
	require.Error(t, err, "the answer was lost")
	require.Equal(t, 1, srv.chargeCount())

	invalid := map[string]func(*http.Request){
		"two key headers": func(r *http.Request) { r.Header["idempotency-key"] = []string{"sdk-key-3"} },
		"a key too long":  func(r *http.Request) { r.Header.Set("Idempotency-Key", strings.Repeat("k", 256)) },
	}
	for name, spoil := range invalid {
		t.Run(name, func(t *testing.T) {
			req := sdkPost(t, "pay:bad-key", "sdk-key-2", srv.URL, `{"amount":1}`)
			spoil(req)
			resp, err := tr.RoundTrip(req)
			require.ErrorIs(t, err, idemretry.ErrInvalidKey)
			o := idemretry.OutcomeOf(resp, err)
			assert.Equal(t, idemretry.Outcome{Kind: idemretry.Refused, Action: "pay:bad-key", Key: "sdk-key-1", Attempts: 1,
				MaybeProcessed: true, Reason: o.Reason}, o)
			assert.ErrorIs(t, o.Reason, idemretry.ErrInvalidKey)

			req = sdkPost(t, "pay:never-sent-"+strings.ReplaceAll(name, " ", "-"), "sdk-key-2", srv.URL, `{"amount":1}`)
			spoil(req)
			resp, err = tr.RoundTrip(req)
			require.ErrorIs(t, err, idemretry.ErrInvalidKey)
			o = idemretry.OutcomeOf(resp, err)
			assert.Equal(t, idemretry.Refused, o.Kind)
			assert.False(t, o.MaybeProcessed, "an action never sent: %v", err)
		})
	}
	assert.Len(t, srv.seen(), 1, "nothing sent with an invalid key")
	rec, found, err := j.Get(context.Background(), "pay:bad-key")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, journal.StatePending, rec.State)
}

// Resume sends a named action under its listed key even when the rebuilt
// request carries two keys of its own (an SDK's and the app's): the keys
// on a rebuilt request are not the action's, and are replaced. (It was
// refused with ErrInvalidKey, its Outcome saying MaybeProcessed false for
// a payment that was charged.)
func TestResumeRebuiltRequestWithTwoKeys(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	_, err := first.RoundTrip(sdkPost(t, "pay:resume-two", "sdk-key-1", srv.URL, `{"amount":1}`))
	require.Error(t, err, "the answer was lost")

	second, _ := newTestTransportOver(t, j)
	results, err := second.Resume(context.Background(), twoKeysResumer{keyedResumer{url: srv.URL, key: "sdk-key-2", body: `{"amount":1}`}}, 1)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.NoError(t, results[0].Err)
	assert.Equal(t, idemretry.Done, results[0].Outcome.Kind)
	assert.True(t, results[0].Outcome.Replayed)
	assert.Equal(t, []string{"sdk-key-1", "sdk-key-1"}, keysOf(srv.seen()))
	assert.Equal(t, 1, srv.chargeCount())
}

// twoKeysResumer rebuilds as keyedResumer does, with a second key header
// under another spelling.
type twoKeysResumer struct{ keyedResumer }

func (r twoKeysResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	req, err := r.keyedResumer.Rebuild(ctx, rec)
	if err == nil {
		req.Header["idempotency-key"] = []string{"app-key"}
	}
	return req, err
}

// The key's form (issue 29, item 6): servers take "K" and K for two keys
// (Fiber refuses the quoted form), so a key goes out in one form for good:
// a caller's as the caller wrote it, a minted one in WithQuotedKey's, the
// form recorded with the key and used for every later attempt and resume.

// firstUnavailable answers the first request 503 and lets the others
// through.
func firstUnavailable(n int, w http.ResponseWriter, _ *http.Request) bool {
	if n == 1 {
		status(http.StatusServiceUnavailable)(w)
		return true
	}
	return false
}

// A key the caller sets goes out exactly as written, bare or quoted,
// whatever WithQuotedKey says, on every attempt.
func TestCallerKeyGoesOutInItsOwnForm(t *testing.T) {
	for _, c := range []struct {
		key  string
		opts []idemretry.Option
	}{
		{"order-Q-1-key", []idemretry.Option{idemretry.WithQuotedKey()}},
		{`"order-Q-2-key"`, nil},
	} {
		srv := newPayServer(t)
		srv.script = firstUnavailable
		tr, _, _ := newTestTransport(t, c.opts...)
		req := post(t, context.Background(), srv.URL, "x")
		req.Header.Set("Idempotency-Key", c.key)
		roundTrip(t, tr, req)
		assert.Equal(t, []string{c.key, c.key}, keysOf(srv.seen()), "%s: the 503's retry too", c.key)
	}
}

// "K" and K are one key (the IETF draft's quoted form of K is K) and one
// action here, and every request of it goes out in the form of its first:
// a server that takes them for two keys sees one, and replays.
func TestQuotedAndBareKeyAreOneAction(t *testing.T) {
	srv := newPayServer(t)
	tr, j, _ := newTestTransport(t)
	for _, v := range []string{`"order-78-key"`, "order-78-key", ` "order-78-key" `} {
		req := post(t, context.Background(), srv.URL, "x")
		req.Header.Set("Idempotency-Key", v)
		roundTrip(t, tr, req)
	}
	assert.Equal(t, []string{`"order-78-key"`, `"order-78-key"`, `"order-78-key"`}, keysOf(srv.seen()))
	assert.Equal(t, 1, srv.chargeCount())
	req := post(t, context.Background(), srv.URL, "another body")
	req.Header.Set("Idempotency-Key", "order-78-key")
	_, err := tr.RoundTrip(req)
	assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "one key, one payload, in either form")
	rec, found, err := j.Get(context.Background(), "key:order-78-key")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, "order-78-key", rec.Key, "kept bare, with its form")
	assert.Equal(t, journal.KeyFormQuoted.String(), rec.KeyForm.String())
}

// A pending action goes out, after a restart and from Resume, in the form
// its key was first sent in, whichever way WithQuotedKey was switched in
// between (on or off).
func TestKeyFormKeptAcrossRestart(t *testing.T) {
	for _, c := range []struct {
		name          string
		before, after []idemretry.Option
		want          func(key string) string
	}{
		{"WithQuotedKey switched on", nil, []idemretry.Option{idemretry.WithQuotedKey()}, func(k string) string { return k }},
		{"WithQuotedKey switched off", []idemretry.Option{idemretry.WithQuotedKey()}, nil, func(k string) string { return `"` + k + `"` }},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.commitThenDrop = map[int]bool{1: true, 2: true} // charged, answers lost
			j := journal.NewMemory()
			first, _ := newTestTransportOver(t, j, append([]idemretry.Option{idemretry.WithMaxRetries(0)}, c.before...)...)
			_, err := first.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:F-1"), srv.URL, `{"order":"F-1"}`))
			require.Error(t, err)
			_, err = first.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:F-2"), srv.URL, `{"order":"F-2"}`))
			require.Error(t, err)

			second, _ := newTestTransportOver(t, j, c.after...)
			resp := roundTrip(t, second, post(t, idemretry.WithAction(context.Background(), "pay:F-1"), srv.URL, `{"order":"F-1"}`))
			assert.True(t, idemretry.IsReplay(resp))
			app := &appResumer{url: srv.URL, orders: map[string]string{"pay:F-2": `{"order":"F-2"}`}}
			results, err := second.Resume(context.Background(), app, 1)
			require.NoError(t, err)
			require.Len(t, results, 1)
			require.NoError(t, results[0].Err)
			assert.True(t, results[0].Sent)

			reqs := srv.seen()
			require.Len(t, reqs, 4)
			for i, r := range reqs {
				rec, found, err := j.Get(context.Background(), []string{"pay:F-1", "pay:F-2"}[i%2])
				require.NoError(t, err)
				require.True(t, found)
				assert.Equal(t, c.want(rec.Key), r.Key, "request %d", i+1)
			}
			assert.Equal(t, 2, srv.chargeCount(), "a resend charged again")
		})
	}
}

// A named action's first request's key is its key, in the form that
// request wrote it: a later request of the action with an SDK's new key,
// in the other form, goes out under the first key in the first form.
func TestNamedActionKeepsItsFirstKeysForm(t *testing.T) {
	srv := newPayServer(t)
	srv.script = firstUnavailable
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	resp := roundTrip(t, tr, sdkPost(t, "pay:form", `"sdk-key-1"`, srv.URL, `{"amount":1}`))
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	roundTrip(t, tr, sdkPost(t, "pay:form", "sdk-key-2", srv.URL, `{"amount":1}`))
	assert.Equal(t, []string{`"sdk-key-1"`, `"sdk-key-1"`}, keysOf(srv.seen()))
}

// A 307/308 hop carries the caller's key that http.Client copies to it in
// the form its parent sent it: the parent's recorded form, when the caller
// wrote the key in the other one this time.
func TestRedirectHopKeyForm(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		switch {
		case n == 1:
			status(http.StatusServiceUnavailable)(w) // left pending, bare
		case r.URL.Path == "/old":
			w.Header().Set("Connection", "close")
			http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
		default:
			return false
		}
		return true
	}
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	c := &http.Client{Transport: tr}
	for _, v := range []string{"hop-key-1", `"hop-key-1"`} {
		req := post(t, context.Background(), srv.URL+"/old", "x")
		req.Header.Set("Idempotency-Key", v)
		resp, err := c.Do(req)
		require.NoError(t, err)
		readAll(t, resp)
	}
	assert.Equal(t, []string{"hop-key-1", "hop-key-1", "hop-key-1"}, keysOf(srv.seen()), "the 503, the 308, the hop")
	assert.Equal(t, 1, srv.chargeCount())
}

// formlessJournal is a journal that keeps no forms (one written before
// they were recorded): every record reads unrecorded.
type formlessJournal struct{ *journal.Memory }

func (j formlessJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	rec.KeyForm = journal.KeyFormUnrecorded
	return j.Memory.Reserve(ctx, rec, mode)
}

// A record whose form is unrecorded (an earlier release's, or a journal's
// that keeps none) goes out in the form WithQuotedKey says, as before
// forms were recorded: a caller's bare key quoted.
func TestUnrecordedKeyFormFollowsWithQuotedKey(t *testing.T) {
	srv := newPayServer(t)
	srv.script = firstUnavailable
	tr, _ := newTestTransportOver(t, formlessJournal{journal.NewMemory()}, idemretry.WithQuotedKey())
	req := post(t, context.Background(), srv.URL, "x")
	req.Header.Set("Idempotency-Key", "order-U-key")
	roundTrip(t, tr, req)
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "y"))
	keys := keysOf(srv.seen())
	require.Len(t, keys, 3)
	assert.Equal(t, []string{`"order-U-key"`, `"order-U-key"`}, keys[:2])
	assert.True(t, strings.HasPrefix(keys[2], `"`) && strings.HasSuffix(keys[2], `"`), keys[2])
}
