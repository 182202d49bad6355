package idemretry_test

// hW1's review: an unnamed payment that the server redirects (307/308),
// tapped again while its hop is in flight.

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

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
