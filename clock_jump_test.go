package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// WithClock says the Transport reads the key window from its clock. With a
// caller-supplied FileJournal (its own, real clock), Transport.now() now takes
// the later of the two: a fake clock that lags the real one can never end a
// window, so a key is sent 25 fake hours after its creation.
func TestFakeClockRulesWindowWithOwnFileJournal(t *testing.T) {
	j, err := idemretry.OpenJournal(t.TempDir())
	require.NoError(t, err)
	defer j.Close()
	clk := newFakeClock()        // 2026-11-29 12:00 UTC
	clk.Advance(-48 * time.Hour) // a simulation that starts in the past
	sent := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		return resp(503, r), nil
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	ctx := idemretry.WithAction(context.Background(), "pay:sim")
	r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()
	clk.Advance(25 * time.Hour) // past the 24 h window on the Transport's clock
	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
	}
	require.True(t, errors.Is(err, idemretry.ErrKeyWindowExpired), "window judged on the journal's real clock, not WithClock: err=%v sent=%d", err, sent)
	require.Equal(t, 1, sent)
}

// A wall clock set FORWARD once (a bad NTP answer, a user fiddling with the
// phone's date) and then corrected freezes the Transport's time at the
// journal's persisted high-water mark: Store.Now returns the mark until the
// real clock catches up. Every key created meanwhile gets that frozen
// CreatedAt, and its window never ends: 25 real hours later the key is sent
// again although the server may have forgotten it (I3/I5).
func TestClockSetForwardThenBackKeepsWindows(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := newFakeClock()
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	clk.Advance(365 * 24 * time.Hour) // clock wrongly a year ahead...
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:while-ahead"), srv.URL, "z"))
	require.NoError(t, err)
	readAll(t, resp)
	clk.Advance(-365 * 24 * time.Hour) // ...and corrected

	ctx := idemretry.WithAction(context.Background(), "pay:after-fix")
	srv.script = scriptFirst(status(503))
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp) // 503: pending

	clk.Advance(25 * time.Hour) // a day later, for real
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	if err == nil {
		readAll(t, resp)
	}
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired, "25 h after its creation the key is still sent: the window never ends")
}
