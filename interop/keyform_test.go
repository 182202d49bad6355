package interop

// The form a key goes out in. None of Fiber, express-idempotency and
// @node-idempotency/nestjs takes "K" and K for one key (Express and NestJS
// see two keys; Fiber refuses the quoted form with a 500): a key sent in
// one form and later in the other is, to the server, a second payment.

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A key the caller sets goes out exactly as the caller wrote it, bare or
// quoted, whatever WithQuotedKey says: stripe-go's bare key must not go out
// quoted, nor a quoted key of the caller's bare.
func TestCallerKeyGoesOutAsWritten(t *testing.T) {
	for _, c := range []struct {
		name   string
		key    string
		quoted bool
	}{
		{"bare key, WithQuotedKey", "order-A-1-key", true},
		{"quoted key, bare by default", `"order-A-2-key"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newWire(t, always(http.StatusCreated, `{"charge":"ch_1"}`))
			var opts []idemretry.Option
			if c.quoted {
				opts = append(opts, idemretry.WithQuotedKey())
			}
			tr, _ := newTransport(t, nil, opts...)
			req := post(t, bg, srv.URL, `{"amount":100}`)
			req.Header.Set("Idempotency-Key", c.key)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, []string{c.key}, srv.seenKeys(), "the caller's key, as written")
		})
	}
}

// The form a key was first sent in is recorded with it and used for every
// later attempt, resumes included: an app that switches WithQuotedKey on
// with actions pending sends them in the form the server already knows.
func TestKeyFormKeptAcrossWithQuotedKey(t *testing.T) {
	srv := newWire(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			write(w, http.StatusServiceUnavailable, "busy")
			return
		}
		write(w, http.StatusCreated, `{"charge":"ch_1"}`)
	})
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	ctx := idemretry.WithAction(bg, "pay:order-Q-1")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":100}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted, "left pending")
	require.NoError(t, tr.Close())

	tr, err = idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithQuotedKey())
	require.NoError(t, err)
	defer tr.Close()
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":100}`))
	require.NoError(t, err)
	resp.Body.Close()
	keys := srv.seenKeys()
	t.Logf("keys as sent: %q", keys)
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1], "the pending action goes out in the form it was first sent in")
}

// Against Fiber's middleware, which takes only a 36-character key: an
// app's own UUID key goes out as written (bare) through a Transport set to
// quote the keys it mints (for another server), so Fiber honours it; the
// answer lost after the charge is resent under the same key and replayed.
// Re-formatted into the quoted form, it was refused with a 500 on every
// attempt, and never charged.
func TestFiberTakesTheCallersKeyAsWritten(t *testing.T) {
	shop := newFiberShop(t)
	proxy := newFaultProxy(t, shop.url)
	proxy.setPlan(first(lostAnswer))
	tr, _ := newTransport(t, nil, idemretry.WithKeyHeader("X-Idempotency-Key"), idemretry.WithQuotedKey(),
		idemretry.WithBackOff(noWait), idemretry.WithRetryBudget(0, 0))
	req := post(t, bg, proxy.URL+"/orders", order("own-key"))
	req.Header.Set("X-Idempotency-Key", "3b7c6e2a-1f4d-4e8a-9c0b-5d6e7f8a9b0c")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("the caller's bare key under WithQuotedKey: %d requests, status %d %q, charged %d",
		proxy.requests(), resp.StatusCode, b, shop.chargesOf("own-key"))
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, 1, shop.chargesOf("own-key"))
	assert.Equal(t, []int{http.StatusCreated, http.StatusCreated}, proxy.statuses(), "the charge, then its replay")
}
