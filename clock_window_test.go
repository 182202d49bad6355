package idemretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// The key window is judged by a time that never runs backwards (the file
// journal's): a clock set back cannot make a 25-hour-old key look young.
func TestKeyWindowSurvivesClockSetBack(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := newFakeClock()
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	ctx := idemretry.WithAction(context.Background(), "pay:old")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp) // 503: pending

	clk.Advance(25 * time.Hour) // the window of pay:old is over
	resp, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:other"), srv.URL, "y"))
	require.NoError(t, err)
	readAll(t, resp)

	clk.Advance(-2 * time.Hour) // NTP / the user sets the clock back
	_, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	assert.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Len(t, srv.seen(), 2, "the 25-hour-old key is not sent again")
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
