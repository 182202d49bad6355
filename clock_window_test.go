package idemretry_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A key whose creation lies in the clock's future (the clock was set back
// since, and the journal has no later time to judge by) has an age nobody can
// know: it is refused with ErrClockSkew, never sent, and stays as it was.
func TestKeyCreatedInClockFutureRefused(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := newFakeClock()
	j := idemretry.NewMemoryJournal() // keeps no time of its own
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	ctx := idemretry.WithAction(context.Background(), "pay:old")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp) // 503: pending

	clk.Advance(-30 * time.Second) // within the skew a fleet's clocks may have
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	require.Len(t, srv.seen(), 2, "a key 30 s in the future is still sent")

	clk.Advance(-2 * time.Hour) // NTP / the user sets the clock back
	_, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	assert.ErrorIs(t, err, idemretry.ErrClockSkew)
	assert.Len(t, srv.seen(), 2, "the key is not sent again")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un, "the done action stays done")
}

// NewTransport warns when its clock is behind times its journal has seen.
func TestClockBehindJournalLogged(t *testing.T) {
	dir := t.TempDir()
	clk := newFakeClock()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir), idemretry.WithClock(clk))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	require.NoError(t, tr.Close())

	clk.Advance(-3 * time.Hour)
	var logs bytes.Buffer
	tr, err = idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir), idemretry.WithClock(clk),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	require.NoError(t, tr.Close())
	assert.Contains(t, logs.String(), "the clock is behind times the journal has seen")
}

// suspendClock's timers fire after d, but the wall clock has moved by jump:
// a phone suspended during the wait (Go's timers stop with the monotonic
// clock while the wall clock keeps going).
type suspendClock struct {
	*fakeClock
	jump time.Duration
}

func (c suspendClock) NewTimer() backoff.Timer { return &suspendTimer{c: c} }

type suspendTimer struct {
	c  suspendClock
	ch chan time.Time
}

func (t *suspendTimer) Start(d time.Duration) {
	t.c.Advance(t.c.jump)
	t.ch = make(chan time.Time, 1)
	t.ch <- t.c.Now()
}
func (t *suspendTimer) Stop()               {}
func (t *suspendTimer) C() <-chan time.Time { return t.ch }

// The window is checked again before the attempt that follows a wait: a
// wait can last longer than asked (a device asleep).
func TestWindowRecheckedBeforeAttempt(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := suspendClock{fakeClock: newFakeClock(), jump: 25 * time.Hour}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(idemretry.NewMemoryJournal()),
		idemretry.WithClock(clk), idemretry.WithBackOff(constant(time.Second)))
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:suspend"), srv.URL, "x"))
	assert.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Len(t, srv.seen(), 1, "no attempt 25 h after the key was minted")
}
