package idemretry_test

// The file journal's expiry under a wall clock that was wrong when a record
// was made (issue 7, item 11).

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A named payment made while the device clock was 49 h behind, the clock
// then corrected, the same action sent again ten real minutes later: the
// journal must not take the record for expired (its creation reads 49 h ago
// on the corrected clock, but it is ten minutes old) and let a new key be
// minted. The Transport refuses it (its window, judged by the clock, is
// over) or sends the same key; never a new one.
func TestNamedActionAfterClockCorrectionNotRekeyed(t *testing.T) {
	for _, behind := range []time.Duration{25 * time.Hour, 49 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(behind.String(), func(t *testing.T) {
			srv := newPayServer(t)
			dir := t.TempDir()
			clk := newFakeClock()
			clk.Advance(-behind) // the device clock is behind
			open := func() *idemretry.Transport {
				tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir), idemretry.WithClock(clk))
				require.NoError(t, err)
				return tr
			}
			tr := open()
			ctx := idemretry.WithAction(context.Background(), "pay:order-1001")
			resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1000}`))
			require.NoError(t, err)
			readAll(t, resp)
			require.NoError(t, tr.Close())

			clk.Advance(behind)           // NTP corrects the clock...
			clk.Advance(10 * time.Minute) // ...and ten real minutes later, the same tap
			tr = open()
			defer tr.Close()
			resp, err = tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1000}`))
			if err == nil {
				readAll(t, resp)
			}
			reqs := srv.seen()
			require.NotEmpty(t, reqs)
			for _, r := range reqs[1:] {
				require.Equal(t, reqs[0].Key, r.Key, "the same action went out under a new key (%d charges)", srv.chargeCount())
			}
			if err != nil && !errors.Is(err, idemretry.ErrKeyWindowExpired) {
				t.Fatalf("refused with %v, want ErrKeyWindowExpired", err)
			}
			require.Equal(t, 1, srv.chargeCount())
		})
	}
}
