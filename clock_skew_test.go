package idemretry_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A key created at C; the clock runs correctly for 25 h (the journal sees
// C+25h: its high-water mark knows the window is over), then is set back 2 h.
// Transport.now trusts the clock alone, so the 25-hour-old key is sent
// again. HEAD~3 refused it (TestKeyWindowSurvivesClockSetBack, rewritten by
// e52afa0).
func TestSetBackAfterWindowKeepsKeyForgotten(t *testing.T) {
	clk := newFakeClock()
	var keys []string
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		return resp(503, r), nil
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	ctx := idemretry.WithAction(context.Background(), "pay:old")
	r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()

	clk.Advance(25 * time.Hour) // window of pay:old over; the journal sees it
	r, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:other"), "http://pay.example/", "y"))
	require.NoError(t, err)
	r.Body.Close()

	clk.Advance(-2 * time.Hour) // NTP / user sets the clock back
	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
	}
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired, "a 25-hour-old key was sent again (keys sent: %d)", len(keys))
}

// A fleet sharing one journal: machine A's clock is 5 min ahead. A's payment
// gets a 503 and stays pending with 24 h of window left. Machine B (correct
// clock) retries it: the key "created in the future" is refused AND the
// record is turned into StateUnknown, for good. Ten minutes later (every
// clock past the creation) the action is still refused: a transient skew
// became a permanent outcome-unknown needing manual reconciliation.
func TestFleetSkewKeepsPending(t *testing.T) {
	j := idemretry.NewMemoryJournal()
	clkA, clkB := newFakeClock(), newFakeClock()
	clkA.Advance(5 * time.Minute)
	sent := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) { sent++; return resp(503, r), nil })
	a, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clkA), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	b, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clkB), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	ctx := idemretry.WithAction(context.Background(), "pay:fleet")
	r, err := a.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()

	_, err = b.RoundTrip(post(t, ctx, "http://pay.example/", "x")) // refused: fine, transient
	require.Error(t, err)

	clkA.Advance(10 * time.Minute)
	clkB.Advance(10 * time.Minute)
	r, err = b.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
	}
	require.NoError(t, err, "10 min later, 23 h50 of window left, the pending action is refused for good")
	require.Equal(t, 2, sent)
}

// README (guarantee 5): "NewTransport logs a clock that is behind times its
// journal has seen". Not when the caller passes the FileJournal.
func TestClockBehindLoggedWithCallerJournal(t *testing.T) {
	dir := t.TempDir()
	clk := newFakeClock()
	j, err := idemretry.OpenJournal(dir, idemretry.WithJournalClock(clk.Now))
	require.NoError(t, err)
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk))
	require.NoError(t, err)
	r, err := tr.RoundTrip(post(t, context.Background(), "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()
	require.NoError(t, j.Close())

	clk.Advance(-3 * time.Hour)
	j, err = idemretry.OpenJournal(dir, idemretry.WithJournalClock(clk.Now))
	require.NoError(t, err)
	defer j.Close()
	var logs bytes.Buffer
	_, err = idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	require.Contains(t, logs.String(), "the clock is behind times the journal has seen")
}

// A clock that ran a year ahead and was corrected: logRecovery compares the
// clock with FileJournal.Now (the unbounded mark, not the MaxClockLead-bounded
// one expiry uses) and warns at every start for a year that windows "may look
// younger", though the clock is right.
func TestNoClockWarningAfterCorrectedForwardJump(t *testing.T) {
	dir := t.TempDir()
	clk := newFakeClock()
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithClock(clk))
	require.NoError(t, err)
	clk.Advance(365 * 24 * time.Hour)
	r, err := tr.RoundTrip(post(t, context.Background(), "http://pay.example/", "x"))
	require.NoError(t, err)
	r.Body.Close()
	require.NoError(t, tr.Close())
	clk.Advance(-365 * 24 * time.Hour) // corrected
	clk.Advance(48 * time.Hour)        // two days later, a normal restart
	var logs bytes.Buffer
	tr, err = idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithClock(clk),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	require.NoError(t, tr.Close())
	require.NotContains(t, logs.String(), "the clock is behind", "false warning for a correct clock")
}
