package idemretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A clock that runs an hour ahead for a moment, with a journal kept no
// longer than the key window: the done record is not expired early, so a
// repeat of the explicit action never gets a new key inside its window (the
// Transport, judging by the later time, may refuse it instead: safe).
func TestForwardBlipNeverRekeysDoneInsideWindow(t *testing.T) {
	clk := newFakeClock()
	var keys []string
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		return resp(201, r), nil
	})
	tr, err := idemretry.NewTransport(base,
		idemretry.WithJournalDir(t.TempDir(), idemretry.WithJournalRetention(idemretry.DefaultKeyWindow)),
		idemretry.WithClock(clk))
	require.NoError(t, err)
	defer tr.Close()
	ctx := idemretry.WithAction(context.Background(), "pay:order-1")
	r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()

	clk.Advance(23*time.Hour + 30*time.Minute)
	clk.Advance(time.Hour) // a bad NTP answer...
	r, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:other"), "http://pay.example/", "y"))
	require.NoError(t, err)
	r.Body.Close()
	clk.Advance(-time.Hour) // ...corrected

	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
		require.Len(t, keys, 3)
		require.Equal(t, keys[0], keys[2], "repeat 23.5 h after creation got a new key")
		return
	}
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	require.Len(t, keys, 2, "refused, nothing sent")
}

// A done explicit action created while the clock ran a year ahead: after the
// correction its age cannot be known, so a repeat is refused with
// ErrClockSkew (nothing sent) until the application forgets it.
func TestDoneFromClockFutureRefusedUntilForgotten(t *testing.T) {
	clk := newFakeClock()
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()), idemretry.WithClock(clk))
	require.NoError(t, err)
	defer tr.Close()
	ctx := idemretry.WithAction(context.Background(), "pay:while-ahead")
	clk.Advance(365 * 24 * time.Hour)
	r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()
	clk.Advance(-365 * 24 * time.Hour)
	clk.Advance(30 * 24 * time.Hour) // a month later
	_, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.ErrorIs(t, err, idemretry.ErrClockSkew)
	require.NoError(t, tr.Journal().Forget(context.Background(), "pay:while-ahead"))
	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()
}
