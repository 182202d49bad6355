package idemretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// One machine, an NTP step back of 2 min: a pending payment retried within
// those 2 min is refused (ErrClockSkew) but stays pending, and goes out
// again once the clock has passed its creation.
func TestTwoMinuteStepBackKeepsPending(t *testing.T) {
	clk := newFakeClock()
	sent := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) { sent++; return resp(503, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	ctx := idemretry.WithAction(context.Background(), "pay:ntp")
	r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()
	clk.Advance(-2 * time.Minute)
	_, _ = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	clk.Advance(time.Hour)
	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
	}
	require.NoError(t, err, "an hour later the action is sent again")
}
