package idemretry_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// I1: the key is in the journal before the first attempt leaves the process.
func TestKeyDurableBeforeFirstSend(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	var inJournal []bool
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		un, err := j.Unfinished(context.Background())
		require.NoError(t, err)
		found := false
		for _, rec := range un {
			found = found || rec.Key == r.Header.Get("Idempotency-Key")
		}
		inJournal = append(inJournal, found)
		return false
	}
	tr, _ := newTestTransportOver(t, j)
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:i1"), srv.URL, "x"))
	assert.Equal(t, []bool{true}, inJournal)
}

// I1: a journal that cannot store the key stops the request before it is sent.
func TestJournalFailureSendsNothing(t *testing.T) {
	j := journal.NewMemory()
	require.NoError(t, j.Close())
	srv := newPayServer(t)
	tr, _ := newTestTransportOver(t, j)
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.ErrorIs(t, err, journal.ErrClosed)
	assert.Empty(t, srv.seen())
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

// Without an action id, the fingerprint finds an unfinished action (a resend
// after a crash) but not a finished one (a deliberate repeat).
func TestFingerprintMatchesPendingOnly(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	resp, err := first.RoundTrip(post(t, context.Background(), srv.URL, "same"))
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode)
	readAll(t, resp)

	second, _ := newTestTransportOver(t, j)
	for range 2 {
		resp, err = second.RoundTrip(post(t, context.Background(), srv.URL, "same"))
		require.NoError(t, err)
		readAll(t, resp)
	}
	keys := keysOf(srv.seen())
	require.Len(t, keys, 3)
	assert.Equal(t, keys[0], keys[1], "the pending action was resumed with its key")
	assert.NotEqual(t, keys[1], keys[2], "a repeat after completion is a new action")
	assert.Equal(t, 2, srv.chargeCount())
}

// I8: an action id reused with another body is refused before sending.
func TestFingerprintMismatchRefused(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:i8")
	roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":100}`))

	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":999}`))
	require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "pay:i8", ae.Action)
	assert.Equal(t, srv.seen()[0].Key, ae.Key)
	assert.Len(t, srv.seen(), 1, "nothing was sent")
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

// The key window: past it, no attempt is made with the key, no new key is
// minted (I3), and the action is marked outcome-unknown.
func TestKeyWindowExpired(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	tr, j, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), "pay:window")
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))

	clk.Advance(idemretry.DefaultKeyWindow)
	for range 2 { // the second time the journal already says unknown
		_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
		require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
		var ae *idemretry.ActionError
		require.ErrorAs(t, err, &ae)
		assert.True(t, ae.MaybeProcessed)
	}
	// The same request without the action id is another action (named by its
	// fingerprint), with a key of its own.
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.NotEqual(t, srv.seen()[0].Key, srv.seen()[1].Key)
	assert.Len(t, srv.seen(), 2)

	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, un, 1)
	assert.Equal(t, journal.StateUnknown, un[0].State)
	assert.Equal(t, srv.seen()[0].Key, un[0].Key)
}

// I3 for fingerprint-identified actions: an unknown outcome is never resent
// under a new key.
func TestUnknownFingerprintActionNotRekeyed(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	tr, _, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "y"))
	clk.Advance(idemretry.DefaultKeyWindow + time.Hour)
	for range 2 {
		_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "y"))
		require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	}
	assert.Len(t, srv.seen(), 1)
}

// I5 for the key window: a wait that would cross it is not started.
func TestNoWaitPastKeyWindow(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, j, clk := newTestTransport(t, idemretry.WithKeyWindow(time.Minute), idemretry.WithBackOff(constant(40*time.Second)))
	ctx := idemretry.WithAction(context.Background(), "pay:near-window")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Len(t, srv.seen(), 2, "one wait of 40 s fits in the minute, the second does not")
	assert.Equal(t, []time.Duration{40 * time.Second}, clk.Waits())
	un, _ := j.Unfinished(context.Background())
	require.Len(t, un, 1)
	assert.Equal(t, journal.StateUnknown, un[0].State)
}

// I3: once an action is outcome-unknown it stays so, even if the clock
// jumps back or the window is widened: only the application's Forget, after
// reconciling, lets the action id be used again.
func TestUnknownSurvivesClockJumpBack(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	j := journal.NewMemory()
	tr, clk := newTestTransportOver(t, j, idemretry.WithKeyWindow(time.Minute),
		idemretry.WithBackOff(constant(50*time.Second)))
	ctx := idemretry.WithAction(context.Background(), "pay:jump")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	sent := len(srv.seen())

	clk.Advance(-time.Hour)
	wider, _ := newTestTransportOver(t, j, idemretry.WithClock(clk))
	_, err = wider.RoundTrip(post(t, ctx, srv.URL, "x"))
	// By the set-back clock the window has not ended: the refusal says the
	// outcome is unknown, without guessing why.
	require.ErrorIs(t, err, idemretry.ErrOutcomeUnknown)
	assert.Len(t, srv.seen(), sent, "nothing sent for an outcome-unknown action")

	require.NoError(t, j.Forget(context.Background(), "pay:jump"))
	srv.script = nil
	resp, err := wider.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	reqs := srv.seen()
	assert.NotEqual(t, reqs[0].Key, reqs[len(reqs)-1].Key, "after Forget, a new key")
}

// The file journal the Transport opens keeps done records for the whole key
// window, even one longer than the journal's default retention.
func TestOwnedJournalRetentionFollowsKeyWindow(t *testing.T) {
	srv := newPayServer(t)
	clk := newFakeClock()
	dir := t.TempDir()
	open := func() *idemretry.Transport {
		tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir),
			idemretry.WithClock(clk), idemretry.WithKeyWindow(96*time.Hour))
		require.NoError(t, err)
		return tr
	}
	ctx := idemretry.WithAction(context.Background(), "pay:long-window")
	tr := open()
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
	require.NoError(t, tr.Close())

	clk.Advance(journal.DefaultRetention + 24*time.Hour) // past the journal's default, inside the window
	tr = open()
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	assert.True(t, idemretry.IsReplay(resp))
	readAll(t, resp)
	keys := keysOf(srv.seen())
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1])
	assert.Equal(t, 1, srv.chargeCount())
}

// The fingerprint is stored in durable journals, so its definition must not
// drift between versions: SHA-256 of method, NUL, URL, NUL, SHA-256(body).
func TestFingerprintDefinitionIsStable(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, j, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	for _, body := range []string{"", `{"amount":1}`} {
		url := srv.URL + "/v1/payments?expand=charge"
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		if body == "" {
			req.Body, req.GetBody = nil, nil
		}
		roundTrip(t, tr, req.WithContext(idemretry.WithAction(context.Background(), "pay:fp-"+body)))

		bodySum := sha256.Sum256([]byte(body))
		want := sha256.Sum256([]byte("POST\x00" + url + "\x00" + string(bodySum[:])))
		un, err := j.Unfinished(context.Background())
		require.NoError(t, err)
		var got []journal.Fingerprint
		for _, r := range un {
			if r.ActionID == "pay:fp-"+body {
				got = append(got, r.Fingerprint)
			}
		}
		assert.Equal(t, []journal.Fingerprint{want}, got, "body %q", body)
	}
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

// A method that carries no key and is not idempotent by definition is sent
// once: retrying it without a key could perform it twice.
func TestUnkeyedUnsafeMethodSentOnce(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithUnkeyedMethods(http.MethodPost))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.Equal(t, []string{""}, keysOf(srv.seen()))

	req, err := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	roundTrip(t, tr, req)
	assert.Len(t, srv.seen(), 1+idemretry.DefaultMaxRetries+1, "PUT is idempotent: retried")
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
