package idemretry_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

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

	_, err := idemretry.NewTransport(nil, idemretry.WithJournal(journal.NewMemory()), idemretry.WithDuplicateWindow(-time.Second))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
	_, err = idemretry.NewTransport(nil, idemretry.WithJournal(journal.NewMemory()), idemretry.WithDuplicateWindow(48*time.Hour))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		charges++
		mu.Unlock()
		arrived <- struct{}{}
		<-release
		w.WriteHeader(201)
		w.Write([]byte(big))
	}))
	defer srv.Close()
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

// Give-ups a person can see: the reason is told by GiveUpReason and logged
// at Warn; a final answer has none.
func TestGiveUpReasons(t *testing.T) {
	var mu sync.Mutex
	answer := func(w http.ResponseWriter) { w.WriteHeader(503) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := answer
		mu.Unlock()
		a(w)
	}))
	defer srv.Close()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr, _, _ := newTestTransport(t, idemretry.WithLogger(logger), idemretry.WithMaxRetries(2))
	set := func(a func(http.ResponseWriter)) { mu.Lock(); answer = a; mu.Unlock() }
	send := func(ctx context.Context, body string) *http.Response {
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, body))
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}

	resp := send(context.Background(), "1")
	assert.Equal(t, 503, resp.StatusCode)
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted)
	assert.Contains(t, logs.String(), "gave up")
	assert.Contains(t, logs.String(), "attempts exhausted")

	set(func(w http.ResponseWriter) { w.Header().Set("Retry-After", "3600"); w.WriteHeader(429) })
	resp = send(context.Background(), "2")
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrRetryAfterTooLong)

	set(func(w http.ResponseWriter) { w.Header().Set("Retry-After", "20"); w.WriteHeader(503) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp = send(ctx, "3")
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrWaitExceedsDeadline)

	set(func(w http.ResponseWriter) { w.WriteHeader(201) })
	resp = send(context.Background(), "4")
	assert.NoError(t, idemretry.GiveUpReason(resp))
	assert.NoError(t, idemretry.GiveUpReason(nil))
}

// hangingReserve is a journal whose Reserve hangs until its context ends.
type hangingReserve struct{ *journal.Memory }

func (h hangingReserve) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// A journal that does not answer within the journal timeout is reported as
// unavailable, and nothing is sent.
func TestJournalTimeoutIsUnavailable(t *testing.T) {
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
		idemretry.WithJournalTimeout(100*time.Millisecond))
	require.NoError(t, err)
	defer tr.Close()
	start := time.Now()
	_, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	assert.ErrorIs(t, err, journal.ErrUnavailable)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Empty(t, srv.seen())
	_, err = idemretry.NewTransport(nil, idemretry.WithJournal(journal.NewMemory()), idemretry.WithJournalTimeout(0))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
}

// Error messages carry the package prefix once, however deep the wrapping.
func TestErrorPrefixOnce(t *testing.T) {
	j := journal.NewMemory()
	require.NoError(t, j.Close())
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), "http://127.0.0.1:1/", "x"))
	require.ErrorIs(t, err, journal.ErrClosed)
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry:"), "%q", err.Error())
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
