package interop

// The form a key goes out in. None of Fiber, express-idempotency and
// @node-idempotency/nestjs takes "K" and K for one key (Express and NestJS
// see two keys; Fiber refuses the quoted form with a 500): a key sent in
// one form and later in the other is, to the server, a second payment.

import (
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
	t.Skip("issue 29 item 6: fixed in phase 2")
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
	t.Skip("issue 29 item 6: fixed in phase 2")
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
