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
