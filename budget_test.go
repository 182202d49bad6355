package idemretry_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/hammer"
)

// outage is a loopback server that answers 503 while down is set, and
// otherwise 201 with Stripe's key semantics; it counts requests per key.
type outage struct {
	*payServer
	down atomic.Bool
}

func newOutage(t *testing.T) *outage {
	o := &outage{payServer: newPayServer(t)}
	o.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool {
		if o.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	return o
}

// An isolated failure finds the budget full and gets every retry.
func TestBudgetIsolatedFailureGetsEveryRetry(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503), status(503), status(503), status(503), status(503))
	tr, _, _ := newTestTransport(t)
	resp := roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.Equal(t, 201, resp.StatusCode)
	assert.Len(t, srv.seen(), 6)
}

// The budget drains by one per retry and refills by the ratio per first
// attempt, exactly as documented; a refused retry parks the action with its
// key, and the resend after the outage goes out under that key.
func TestBudgetDrainsRefillsAndParks(t *testing.T) {
	srv := newOutage(t)
	srv.down.Store(true)
	tr, j, _ := newTestTransport(t, idemretry.WithRetryBudget(3, 0.5))
	send := func(body string) error {
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
		if err == nil {
			readAll(t, resp)
		}
		return err
	}
	counts := []int{}
	for i := range 3 {
		before := len(srv.seen())
		err := send(fmt.Sprintf(`{"n":%d}`, i))
		require.ErrorIs(t, err, idemretry.ErrParked, "action %d", i)
		var ae *idemretry.ActionError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, 503, ae.Status)
		assert.True(t, ae.MaybeProcessed)
		counts = append(counts, len(srv.seen())-before)
	}
	// 3 tokens: 3 retries, then refused; +0.5: none; +0.5 = 1: one.
	assert.Equal(t, []int{4, 1, 2}, counts)
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Len(t, un, 3, "parked actions stay pending with their keys")

	srv.down.Store(false)
	for i := range 3 {
		require.NoError(t, send(fmt.Sprintf(`{"n":%d}`, i)))
	}
	perKey := map[string]int{}
	for _, r := range srv.seen() {
		perKey[r.Key]++
	}
	assert.Len(t, perKey, 3, "each parked action completed under its own first key")
	assert.Equal(t, 3, srv.chargeCount())
}

// In a total outage, retries add about the ratio to the first attempts
// (plus the capacity once); without the budget, every action retries five
// times. Concurrent senders keep the bucket consistent under -race.
func TestBudgetTotalOutage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []idemretry.Option
		most    int
		atLeast int
	}{
		{"default budget", nil, 200 + 10 + 20, 200},
		{"no budget", []idemretry.Option{idemretry.WithRetryBudget(0, 0)}, 6 * 200, 6 * 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newOutage(t)
			srv.down.Store(true)
			tr, _, _ := newTestTransport(t, tc.opts...)
			var parked atomic.Int64
			hammer.Run(8, 25, func(g, i int) {
				resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, fmt.Sprintf(`{"g":%d,"i":%d}`, g, i)))
				if err == nil {
					readAll(t, resp)
				} else if assert.ErrorIs(t, err, idemretry.ErrParked) {
					parked.Add(1)
				}
			})
			n := len(srv.seen())
			assert.LessOrEqual(t, n, tc.most)
			assert.GreaterOrEqual(t, n, tc.atLeast)
			t.Logf("%s: %d requests for 200 actions, %d parked", tc.name, n, parked.Load())
		})
	}
}

func TestBudgetOptionsValidated(t *testing.T) {
	t.Parallel()
	for _, o := range []idemretry.Option{
		idemretry.WithRetryBudget(-1, 0.1), idemretry.WithRetryBudget(10, 1.5),
		idemretry.WithRetryBudget(0.5, 0.1), idemretry.WithRetryBudget(10, -0.1),
	} {
		_, err := idemretry.NewTransport(nil, inMemory(), o)
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
	}
}

// Per-request overrides change what they say, for that request only, and
// compose with WithAction.
func TestRequestOptions(t *testing.T) {
	srv := newOutage(t)
	srv.down.Store(true)
	tr, _, clk := newTestTransport(t, idemretry.WithRetryBudget(0, 0), idemretry.WithBackOff(constant(time.Second)))
	send := func(ctx context.Context, body string) int {
		before := len(srv.seen())
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, body))
		if err == nil {
			readAll(t, resp)
		}
		return len(srv.seen()) - before
	}
	bg := context.Background()
	assert.Equal(t, 1, send(idemretry.WithRequestOptions(bg, idemretry.RequestMaxRetries(0)), "a"))
	assert.Equal(t, 3, send(idemretry.WithRequestOptions(bg, idemretry.RequestMaxRetries(2)), "b"))
	assert.Equal(t, 6, send(bg, "c"), "the Transport's own setting for a request without overrides")
	never := func(context.Context, *http.Response, error) bool { return false }
	assert.Equal(t, 1, send(idemretry.WithRequestOptions(bg, idemretry.RequestRetryPolicy(never)), "d"))
	waits := len(clk.Waits())
	assert.Equal(t, 3, send(idemretry.WithRequestOptions(bg, idemretry.RequestMaxRetries(2),
		idemretry.RequestBackOff(constant(3*time.Second))), "e"))
	assert.Equal(t, []time.Duration{3 * time.Second, 3 * time.Second}, clk.Waits()[waits:])

	// With WithAction: the same key as the action's other requests.
	actx := idemretry.WithAction(bg, "pay:override")
	send(idemretry.WithRequestOptions(actx, idemretry.RequestMaxRetries(0)), "f")
	send(actx, "f")
	reqs := srv.seen()
	assert.Equal(t, reqs[len(reqs)-7].Key, reqs[len(reqs)-1].Key)

	// A shorter key window: a key older than it is not sent.
	old := idemretry.WithAction(bg, "pay:window")
	send(idemretry.WithRequestOptions(old, idemretry.RequestMaxRetries(0)), "g")
	clk.Advance(2 * time.Hour)
	_, err := tr.RoundTrip(post(t, idemretry.WithRequestOptions(old, idemretry.RequestKeyWindow(time.Hour)), srv.URL, "g"))
	assert.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)

	for _, o := range []idemretry.RequestOption{idemretry.RequestMaxRetries(-1), idemretry.RequestKeyWindow(0), idemretry.RequestKeyWindow(48 * time.Hour)} {
		before := len(srv.seen())
		_, err := tr.RoundTrip(post(t, idemretry.WithRequestOptions(bg, o), srv.URL, "h"))
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
		assert.Equal(t, before, len(srv.seen()), "nothing sent")
	}
}

// Retry-After is a floor: twenty clients told "Retry-After: 1" come back
// spread over the drawn window above it, not all at once.
func TestRetryAfterSpreadsTheHerd(t *testing.T) {
	var waits []time.Duration
	for range 20 {
		srv := newPayServer(t)
		srv.script = scriptFirst(status(503, "Retry-After", "1"))
		tr, _, clk := newTestTransport(t)
		roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
		require.Len(t, clk.Waits(), 1)
		waits = append(waits, clk.Waits()[0])
	}
	lo, hi := waits[0], waits[0]
	for _, w := range waits {
		assert.GreaterOrEqual(t, w, time.Second, "Retry-After is a floor")
		assert.Less(t, w, time.Second+idemretry.DefaultBaseDelay, "at most one drawn wait above it")
		lo, hi = min(lo, w), max(hi, w)
	}
	assert.Greater(t, hi-lo, 100*time.Millisecond, "twenty clients came back within %v of each other", hi-lo)
}

// An unnamed payment parked by the budget keeps its key: its resend
// carries the key of its first attempt.
func TestParkedUnnamedKeepsKey(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503), status(503))
	tr, _, _ := newTestTransport(t, idemretry.WithRetryBudget(1, 0))
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"x":2}`))
	require.ErrorIs(t, err, idemretry.ErrParked)
	srv.script = nil
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"x":2}`))
	require.NoError(t, err)
	resp.Body.Close()
	s := srv.seen()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, s[len(s)-2].Key, s[len(s)-1].Key)
}
