package idemretry_test

// Key windows under clocks that jump: set back, set forward, skewed.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// A key whose creation lies in the clock's future (the clock was set back
// since, and the journal has no later time to judge by) has an age nobody can
// know: it is refused with ErrClockSkew, never sent, and stays as it was.
func TestKeyCreatedInClockFutureRefused(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := newFakeClock()
	j := journal.NewMemory() // keeps no time of its own
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	ctx := idemretry.WithAction(context.Background(), "pay:old")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp) // 503: pending

	clk.Advance(-30 * time.Second) // within the skew a fleet's clocks may have
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
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
	t.Parallel()
	dir := t.TempDir()
	clk := newFakeClock()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir), idemretry.WithClock(clk))
	require.NoError(t, err)
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
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

func (c suspendClock) NewTimer() idemretry.Timer { return &suspendTimer{c: c} }

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
	t.Parallel()
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := suspendClock{fakeClock: newFakeClock(), jump: 25 * time.Hour}
	tr, err := idemretry.NewTransport(&http.Transport{}, inMemory(),
		idemretry.WithClock(clk), idemretry.WithBackOff(constant(time.Second)))
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:suspend"), srv.URL, "x"))
	assert.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Len(t, srv.seen(), 1, "no attempt 25 h after the key was minted")
}

// A key created at C; the clock runs correctly for 25 h (the journal sees
// C+25h: its high-water mark knows the window is over), then is set back 2 h.
// Transport.now trusts the clock alone, so the 25-hour-old key is sent
// again. HEAD~3 refused it (TestKeyWindowSurvivesClockSetBack, rewritten by
// e52afa0).
func TestSetBackAfterWindowKeepsKeyForgotten(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	tr, ctx, base := pendingOnFileJournal(t, clk, "pay:old")

	clk.Advance(25 * time.Hour) // window of pay:old over; the journal sees it
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:other"), "http://pay.example/", "y"))

	clk.Advance(-2 * time.Hour) // NTP / user sets the clock back
	err := sendErr(tr, post(t, ctx, "http://pay.example/", "x"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired, "a 25-hour-old key was sent again (keys sent: %d)", len(base.keys))
}

// A fleet sharing one journal: machine A's clock is 5 min ahead. A's payment
// gets a 503 and stays pending with 24 h of window left. Machine B (correct
// clock) retries it: the key "created in the future" is refused AND the
// record is turned into StateUnknown, for good. Ten minutes later (every
// clock past the creation) the action is still refused: a transient skew
// became a permanent outcome-unknown needing manual reconciliation.
func TestFleetSkewKeepsPending(t *testing.T) {
	t.Parallel()
	j := journal.NewMemory()
	clkA, clkB := newFakeClock(), newFakeClock()
	clkA.Advance(5 * time.Minute)
	base := &stubServer{status: 503}
	a, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clkA), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	b, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clkB), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	ctx := idemretry.WithAction(context.Background(), "pay:fleet")
	roundTrip(t, a, post(t, ctx, "http://pay.example/", "x"))

	_, err = b.RoundTrip(post(t, ctx, "http://pay.example/", "x")) // refused: fine, transient
	require.Error(t, err)

	clkA.Advance(10 * time.Minute)
	clkB.Advance(10 * time.Minute)
	err = sendErr(b, post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err, "10 min later, 23 h50 of window left, the pending action is refused for good")
	require.Len(t, base.keys, 2)
}

// README (guarantee 5): "NewTransport logs a clock that is behind times its
// journal has seen". Not when the caller passes a filejournal.Journal.
func TestClockBehindLoggedWithCallerJournal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clk := newFakeClock()
	j, err := filejournal.Open(dir, filejournal.WithClock(clk.Now))
	require.NoError(t, err)
	base := &stubServer{status: 201}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk))
	require.NoError(t, err)
	roundTrip(t, tr, post(t, context.Background(), "http://pay.example/", "x"))
	require.NoError(t, j.Close())

	clk.Advance(-3 * time.Hour)
	j, err = filejournal.Open(dir, filejournal.WithClock(clk.Now))
	require.NoError(t, err)
	defer j.Close()
	var logs bytes.Buffer
	_, err = idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	require.Contains(t, logs.String(), "the clock is behind times the journal has seen")
}

// A clock that ran a year ahead and was corrected: logRecovery compares the
// clock with filejournal.Journal.Now (the unbounded mark, not the MaxClockLead-bounded
// one expiry uses) and warns at every start for a year that windows "may look
// younger", though the clock is right.
func TestNoClockWarningAfterCorrectedForwardJump(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clk := newFakeClock()
	base := &stubServer{status: 201}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithClock(clk))
	require.NoError(t, err)
	clk.Advance(365 * 24 * time.Hour)
	roundTrip(t, tr, post(t, context.Background(), "http://pay.example/", "x"))
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

// One machine, an NTP step back of 2 min: a pending payment retried within
// those 2 min is refused (ErrClockSkew) but stays pending, and goes out
// again once the clock has passed its creation.
func TestTwoMinuteStepBackKeepsPending(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	tr, ctx, _ := pendingOnFileJournal(t, clk, "pay:ntp")
	clk.Advance(-2 * time.Minute)
	_, _ = tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	clk.Advance(time.Hour)
	err := sendErr(tr, post(t, ctx, "http://pay.example/", "x"))
	require.NoError(t, err, "an hour later the action is sent again")
}

// WithClock says the Transport reads the key window from its clock. With a
// caller-supplied filejournal.Journal (its own, real clock), Transport.now() now takes
// the later of the two: a fake clock that lags the real one can never end a
// window, so a key is sent 25 fake hours after its creation.
func TestFakeClockRulesWindowWithOwnFileJournal(t *testing.T) {
	t.Parallel()
	j, err := filejournal.Open(t.TempDir())
	require.NoError(t, err)
	defer j.Close()
	clk := newFakeClock()        // 2026-11-29 12:00 UTC
	clk.Advance(-48 * time.Hour) // a simulation that starts in the past
	base := &stubServer{status: 503}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	ctx := idemretry.WithAction(context.Background(), "pay:sim")
	roundTrip(t, tr, post(t, ctx, "http://pay.example/", "x"))
	clk.Advance(25 * time.Hour) // past the 24 h window on the Transport's clock
	err = sendErr(tr, post(t, ctx, "http://pay.example/", "x"))
	require.True(t, errors.Is(err, idemretry.ErrKeyWindowExpired), "window judged on the journal's real clock, not WithClock: err=%v sent=%d", err, len(base.keys))
	require.Len(t, base.keys, 1)
}

// A wall clock set FORWARD once (a bad NTP answer, a user fiddling with the
// phone's date) and then corrected freezes the Transport's time at the
// journal's persisted high-water mark: Store.Now returns the mark until the
// real clock catches up. Every key created meanwhile gets that frozen
// CreatedAt, and its window never ends: 25 real hours later the key is sent
// again although the server may have forgotten it (I3/I5).
func TestClockSetForwardThenBackKeepsWindows(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	clk := newFakeClock()
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	clk.Advance(365 * 24 * time.Hour) // clock wrongly a year ahead...
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:while-ahead"), srv.URL, "z"))
	clk.Advance(-365 * 24 * time.Hour) // ...and corrected

	ctx := idemretry.WithAction(context.Background(), "pay:after-fix")
	srv.script = scriptFirst(status(503))
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp) // 503: pending

	clk.Advance(25 * time.Hour) // a day later, for real
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	if err == nil {
		readAll(t, resp)
	}
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired, "25 h after its creation the key is still sent: the window never ends")
}

// A clock that runs an hour ahead for a moment, with a journal kept no
// longer than the key window: the done record is not expired early, so a
// repeat of the explicit action never gets a new key inside its window (the
// Transport, judging by the later time, may refuse it instead: safe).
func TestForwardBlipNeverRekeysDoneInsideWindow(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	base := &stubServer{status: 201}
	tr, err := idemretry.NewTransport(base,
		idemretry.WithJournalDir(t.TempDir(), filejournal.WithGrace(0)),
		idemretry.WithClock(clk))
	require.NoError(t, err)
	defer tr.Close()
	ctx := idemretry.WithAction(context.Background(), "pay:order-1")
	roundTrip(t, tr, post(t, ctx, "http://pay.example/", "x"))

	clk.Advance(23*time.Hour + 30*time.Minute)
	clk.Advance(time.Hour) // a bad NTP answer...
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:other"), "http://pay.example/", "y"))
	clk.Advance(-time.Hour) // ...corrected

	r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
		require.Len(t, base.keys, 3)
		require.Equal(t, base.keys[0], base.keys[2], "repeat 23.5 h after creation got a new key")
		return
	}
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	require.Len(t, base.keys, 2, "refused, nothing sent")
}

// A done explicit action created while the clock ran a year ahead: after the
// correction its age cannot be known, so a repeat is refused with
// ErrClockSkew (nothing sent) until the application forgets it.
func TestDoneFromClockFutureRefusedUntilForgotten(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	base := &stubServer{status: 201}
	tr := onFileJournal(t, base, clk)
	ctx := idemretry.WithAction(context.Background(), "pay:while-ahead")
	clk.Advance(365 * 24 * time.Hour)
	roundTrip(t, tr, post(t, ctx, "http://pay.example/", "x"))
	clk.Advance(-365 * 24 * time.Hour)
	clk.Advance(30 * 24 * time.Hour) // a month later
	_, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
	require.ErrorIs(t, err, idemretry.ErrClockSkew)
	require.NoError(t, tr.Journal().Forget(context.Background(), "pay:while-ahead"))
	roundTrip(t, tr, post(t, ctx, "http://pay.example/", "x"))
}

// A clock set back 2 h with a 1 h window and a file journal that has seen the
// later time: a key minted now is aged from its minting, not judged by the
// journal's later time, so a new action is sent, not refused.
func TestSetBackDoesNotRefuseNewActions(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	base := &stubServer{status: 201}
	tr := onFileJournal(t, base, clk, idemretry.WithKeyWindow(time.Hour), idemretry.WithMaxRetries(0))
	sendOK(t, tr, "pay:1", "a")
	clk.Advance(-2 * time.Hour) // NTP steps the clock back 2 h
	ctx := idemretry.WithAction(context.Background(), "pay:new")
	err := sendErr(tr, post(t, ctx, "http://pay.example/", "b"))
	require.NoError(t, err, "a brand-new action was refused (sent=%d)", len(base.keys))
}

// The same with the default window and a set-back of 23h59m: a new action
// keeps its whole window for its retries.
func TestSetBackDoesNotShrinkNewWindows(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	n := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		n++
		if n == 2 {
			return resp(503, r), nil
		}
		return resp(201, r), nil
	})
	tr := onFileJournal(t, base, clk, idemretry.WithMaxRetries(3), idemretry.WithBackOff(constant(2*time.Minute)))
	sendOK(t, tr, "pay:1", "a")
	clk.Advance(-(23*time.Hour + 59*time.Minute))
	err := sendErr(tr, post(t, idemretry.WithAction(context.Background(), "pay:new"), "http://pay.example/", "b"))
	require.NoError(t, err, "a new action with a 503 became outcome-unknown after one 2-min wait")
}

// A never-sent action is never left outcome-unknown by a set-back, nor
// reported as maybe processed.
func TestSetBackNeverPoisonsNeverSentAction(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	base := &stubServer{status: 201}
	tr := onFileJournal(t, base, clk, idemretry.WithKeyWindow(time.Hour), idemretry.WithMaxRetries(0))
	sendOK(t, tr, "pay:1", "a")
	clk.Advance(-2 * time.Hour)
	ctx := idemretry.WithAction(context.Background(), "pay:new")
	_, _ = tr.RoundTrip(post(t, ctx, "http://pay.example/", "b"))
	clk.Advance(3 * time.Hour) // clock past the mark again
	err := sendErr(tr, post(t, ctx, "http://pay.example/", "b"))
	var ae *idemretry.ActionError
	if len(base.keys) == 1 && errors.As(err, &ae) && ae.MaybeProcessed {
		t.Fatalf("never-sent action (attempts=%d) left StateUnknown and reported MaybeProcessed: %v", ae.Attempts, err)
	}
}

// stubServer stands in for a server: it answers every request with status
// and keeps the Idempotency-Key each one carried.
type stubServer struct {
	status int
	keys   []string
}

func (s *stubServer) RoundTrip(r *http.Request) (*http.Response, error) {
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	return resp(s.status, r), nil
}

// onFileJournal returns a Transport over a file journal in a fresh
// directory, on clk, sending through base; it is closed when the test ends.
func onFileJournal(t *testing.T, base http.RoundTripper, clk idemretry.Clock, opts ...idemretry.Option) *idemretry.Transport {
	t.Helper()
	all := append([]idemretry.Option{idemretry.WithJournalDir(t.TempDir()), idemretry.WithClock(clk)}, opts...)
	tr, err := idemretry.NewTransport(base, all...)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// pendingOnFileJournal sends action once, body "x", through a Transport on
// a file journal ruled by clk, to a server that answers 503, with no
// retries: the action is left pending. It returns the Transport, the
// action's context and the server.
func pendingOnFileJournal(t *testing.T, clk idemretry.Clock, action string) (*idemretry.Transport, context.Context, *stubServer) {
	t.Helper()
	base := &stubServer{status: 503}
	tr := onFileJournal(t, base, clk, idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), action)
	roundTrip(t, tr, post(t, ctx, "http://pay.example/", "x"))
	return tr, ctx, base
}

// sendOK posts body as action and requires a response, which it closes.
func sendOK(t *testing.T, tr *idemretry.Transport, action, body string) {
	t.Helper()
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), action), "http://pay.example/", body))
}

// The file journal's expiry under a wall clock that was wrong when a record
// was made (issue 7, item 11).

// A named payment made while the device clock was 49 h behind, the clock
// then corrected, the same action sent again ten real minutes later: the
// journal must not take the record for expired (its creation reads 49 h ago
// on the corrected clock, but it is ten minutes old) and let a new key be
// minted. The Transport refuses it (its window, judged by the clock, is
// over) or sends the same key; never a new one.
func TestNamedActionAfterClockCorrectionNotRekeyed(t *testing.T) {
	t.Parallel()
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
			roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":1000}`))
			require.NoError(t, tr.Close())

			clk.Advance(behind)           // NTP corrects the clock...
			clk.Advance(10 * time.Minute) // ...and ten real minutes later, the same tap
			tr = open()
			defer tr.Close()
			resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1000}`))
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

// legacyClock is a Clock written for releases whose Clock embedded
// cenkalti/backoff's: its NewTimer returns a backoff.Timer.
type legacyClock struct{ *fakeClock }

func (c legacyClock) NewTimer() backoff.Timer { return c.fakeClock.NewTimer() }

// nowOnlyClock is a Clock without timers.
type nowOnlyClock struct{}

func (nowOnlyClock) Now() time.Time { return time.Now() }

// wrongTimerClock has a NewTimer that is not a TimerClock's.
type wrongTimerClock struct{ nowOnlyClock }

func (wrongTimerClock) NewTimer() *time.Timer { return time.NewTimer(time.Hour) }

// The Transport waits on a TimerClock's timers, on those of a Clock of the
// backoff/v4 form too, and on the system's for a Clock with Now alone; a
// NewTimer of another signature is refused rather than quietly replaced
// by the system's timers.
func TestClockTimerForms(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		clk   func(*fakeClock) idemretry.Clock
		delay time.Duration // between attempts
		fake  bool          // the waits are the fake clock's
	}{
		"TimerClock":      {func(c *fakeClock) idemretry.Clock { return c }, 10 * time.Second, true},
		"backoff/v4 form": {func(c *fakeClock) idemretry.Clock { return legacyClock{c} }, 10 * time.Second, true},
		"Now alone":       {func(*fakeClock) idemretry.Clock { return nowOnlyClock{} }, time.Millisecond, false},
	} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(status(503), status(503))
			fake := newFakeClock()
			tr := transportOver(t, journal.NewMemory(), idemretry.WithClock(tc.clk(fake)), idemretry.WithBackOff(constant(tc.delay)))
			ctx, cancel := context.WithTimeout(idemretry.WithAction(context.Background(), "pay:1"), time.Minute)
			defer cancel()
			resp := roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			srv.requireOnePayment(t, 3)
			if tc.fake {
				assert.Equal(t, []time.Duration{tc.delay, tc.delay}, fake.Waits(), "waited on the fake clock")
			} else {
				assert.Empty(t, fake.Waits())
			}
		})
	}
	_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithClock(wrongTimerClock{}))
	require.ErrorIs(t, err, idemretry.ErrInvalidOption)
	assert.Contains(t, err.Error(), "NewTimer")
}

// The key window: past it, no attempt is made with the key, no new key is
// minted (I3), and the action is marked outcome-unknown.
func TestKeyWindowExpired(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	tr, j, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), "pay:window")
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))

	clk.Advance(idemretry.DefaultKeyWindow)
	for range 2 { // the second time the journal already says unknown
		_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
		require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
		var ae *idemretry.ActionError
		require.ErrorAs(t, err, &ae)
		assert.True(t, ae.MaybeProcessed)
	}
	// The same request without the action id is another action (named by its
	// fingerprint), with a key of its own.
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.NotEqual(t, srv.seen()[0].Key, srv.seen()[1].Key)
	assert.Len(t, srv.seen(), 2)

	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, un, 1)
	assert.Equal(t, journal.StateUnknown, un[0].State)
	assert.Equal(t, srv.seen()[0].Key, un[0].Key)
}

// I3 for fingerprint-identified actions: an unknown outcome is never resent
// under a new key.
func TestUnknownFingerprintActionNotRekeyed(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	tr, _, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "y"))
	clk.Advance(idemretry.DefaultKeyWindow + time.Hour)
	for range 2 {
		_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "y"))
		require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	}
	assert.Len(t, srv.seen(), 1)
}

// I5 for the key window: a wait that would cross it is not started.
func TestNoWaitPastKeyWindow(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, j, clk := newTestTransport(t, idemretry.WithKeyWindow(time.Minute), idemretry.WithBackOff(constant(40*time.Second)))
	ctx := idemretry.WithAction(context.Background(), "pay:near-window")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Len(t, srv.seen(), 2, "one wait of 40 s fits in the minute, the second does not")
	assert.Equal(t, []time.Duration{40 * time.Second}, clk.Waits())
	un, _ := j.Unfinished(context.Background())
	require.Len(t, un, 1)
	assert.Equal(t, journal.StateUnknown, un[0].State)
}

// I3: once an action is outcome-unknown it stays so, even if the clock
// jumps back or the window is widened: only the application's Forget, after
// reconciling, lets the action id be used again.
func TestUnknownSurvivesClockJumpBack(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	j := journal.NewMemory()
	tr, clk := newTestTransportOver(t, j, idemretry.WithKeyWindow(time.Minute),
		idemretry.WithBackOff(constant(50*time.Second)))
	ctx := idemretry.WithAction(context.Background(), "pay:jump")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	sent := len(srv.seen())

	clk.Advance(-time.Hour)
	wider, _ := newTestTransportOver(t, j, idemretry.WithClock(clk))
	_, err = wider.RoundTrip(post(t, ctx, srv.URL, "x"))
	// By the set-back clock the window has not ended: the refusal says the
	// outcome is unknown, without guessing why.
	require.ErrorIs(t, err, idemretry.ErrOutcomeUnknown)
	assert.Len(t, srv.seen(), sent, "nothing sent for an outcome-unknown action")

	require.NoError(t, j.Forget(context.Background(), "pay:jump"))
	srv.script = nil
	resp, err := wider.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	reqs := srv.seen()
	assert.NotEqual(t, reqs[0].Key, reqs[len(reqs)-1].Key, "after Forget, a new key")
}

// hK2's review: a pending action whose keyed fingerprint cannot be checked
// here (made under another secret: fingerprint.key deleted, the record
// copied from another journal) is refused "until its key window ends"
// (README, "What it stores"). After that it must go the way of every
// pending action past its window: recorded outcome-unknown, refused with
// ErrKeyWindowExpired, and handed to Resume's Resolve, never sent. It must
// not stay pending, refused as uncheckable, at every RoundTrip and every
// Resume for ever.

const uncheckableAction = "pay:hk2-large"

var uncheckableBody = bytes.Repeat([]byte("0123456789abcdef"), 80<<10/16) // 80 KiB: keyed

func uncheckableRequest(t testing.TB, ctx context.Context, url string) *http.Request {
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, uncheckableAction), http.MethodPost, url+"/charges", bytes.NewReader(uncheckableBody))
	require.NoError(t, err)
	return req
}

// foreignKeyedRecord returns the pending record of uncheckableAction made by a
// Transport over another Memory (another secret), whose attempt the server
// refused with a 503, on clk: a keyed fingerprint this journal cannot check.
func foreignKeyedRecord(t *testing.T, clk *fakeClock, url string) journal.Record {
	t.Helper()
	other := journal.NewMemory(journal.WithClock(clk.Now))
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(other), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(uncheckableRequest(t, context.Background(), url))
	if err == nil {
		readAll(t, resp)
	}
	recs, err := other.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	rec := recs[0]
	require.Equal(t, journal.StatePending, rec.State)
	if string(rec.Fingerprint[:4]) != "irk\x01" {
		t.Skip("this CPU makes plain fingerprints: nothing keyed to check")
	}
	return rec
}

type uncheckableResumer struct {
	t        *testing.T
	url      string
	resolved atomic.Int32
}

func (r *uncheckableResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return uncheckableRequest(r.t, ctx, r.url), nil
}

func (r *uncheckableResumer) Resolve(context.Context, journal.Record) (bool, error) {
	r.resolved.Add(1)
	return true, nil
}

// uncheckablePastWindow: a journal holding the foreign pending record, a Transport over
// it, and the server's count of requests with the record's key.
func uncheckablePastWindow(t *testing.T) (*idemretry.Transport, *journal.Memory, *fakeClock, journal.Record, *atomic.Int32, string) {
	var seen, wrong atomic.Int32
	var key atomic.Value
	key.Store("")
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if k := key.Load().(string); k != "" && r.Header.Get("Idempotency-Key") == k {
			seen.Add(1)
		} else if k != "" {
			wrong.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	t.Cleanup(func() { require.Zero(t, wrong.Load(), "a request under another key was sent") })
	clk := newFakeClock()
	rec := foreignKeyedRecord(t, clk, srv.URL)
	key.Store(rec.Key)
	j := journal.NewMemory(journal.WithClock(clk.Now))
	_, created, err := j.Reserve(context.Background(), rec, journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	base := &http.Transport{}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, tr.Close())
		base.CloseIdleConnections()
	})
	// Within its window: refused as uncheckable, nothing sent (as the
	// earlier rounds tested).
	err = sendErr(tr, uncheckableRequest(t, context.Background(), srv.URL))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.Contains(t, err.Error(), "cannot be checked")
	require.ErrorIs(t, err, idemretry.ErrFingerprintUncheckable)
	require.Zero(t, seen.Load())
	clk.Advance(idemretry.DefaultKeyWindow + 2*time.Hour)
	return tr, j, clk, rec, &seen, srv.URL
}

func uncheckableState(t *testing.T, j *journal.Memory) journal.State {
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	if len(recs) == 0 {
		return 0
	}
	require.Len(t, recs, 1)
	return recs[0].State
}

// TestKeyWindowOfAnUncheckableActionRoundTrip: after its window, a
// RoundTrip of the action finds its key window ended, as for any pending
// action, and records it outcome-unknown.
//
// Found in review hk2 (2b5c04c; was TestReviewHK2UncheckablePastWindowRoundTrip).
func TestKeyWindowOfAnUncheckableActionRoundTrip(t *testing.T) {
	t.Parallel()
	tr, j, _, _, seen, url := uncheckablePastWindow(t)
	err := sendErr(tr, uncheckableRequest(t, context.Background(), url))
	require.True(t, errors.Is(err, idemretry.ErrKeyWindowExpired), "past its key window: %v", err)
	require.Equal(t, journal.StateUnknown, uncheckableState(t, j), "left pending past its key window")
	require.Zero(t, seen.Load(), "sent")
}

// TestKeyWindowOfAnUncheckableActionResume: Resume hands it to Resolve
// once its window (and the settle time) have passed, and forgets it.
//
// Found in review hk2 (2b5c04c; was TestReviewHK2UncheckablePastWindowResume).
func TestKeyWindowOfAnUncheckableActionResume(t *testing.T) {
	t.Parallel()
	tr, j, _, _, seen, url := uncheckablePastWindow(t)
	r := &uncheckableResumer{t: t, url: url}
	for round := 0; round < 2; round++ { // a second Resume finds what the first left
		res, err := tr.Resume(context.Background(), r, 1)
		require.NoError(t, err)
		if r.resolved.Load() > 0 {
			break
		}
		require.Len(t, res, 1)
		t.Logf("Resume %d: %v", round, res[0].Err)
	}
	require.EqualValues(t, 1, r.resolved.Load(), "never handed to Resolve: stuck pending for ever")
	require.Zero(t, uncheckableState(t, j), "not forgotten")
	require.Zero(t, seen.Load(), "sent")
}

// README guarantee 5: no wait starts that would end after "the key
// window". As with the deadline (attempt_test.go's
// TestNoHopelessRetryWaitAfterASlowProgressWrite), the window was checked
// before the discarded answer's drain and the attempt count's journal
// write (here 2 s, the journal timeout): the 3 s wait that fitted the 4 s window when drawn
// no longer did, started all the same, and RoundTrip found the window over
// only when it ended, 5 s on.
//
// Found in review hv3 (8c60b37; was TestHV3NoRetryWaitPastTheKeyWindowAfterASlowProgressWrite).
func TestKeyWindowNoRetryWaitPastItAfterASlowProgressWrite(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	j := &slowProgressJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(2*time.Second), idemretry.WithKeyWindow(4*time.Second),
		idemretry.WithBackOff(constant(3*time.Second)), idemretry.WithMaxRetries(3))
	start := time.Now()
	err := sendErr(tr, post(t, idemretry.WithAction(context.Background(), "pay:hv3-window"), srv.URL, `{"amount":2}`))
	took := time.Since(start)
	require.NotZero(t, j.progress.Load(), "the attempt count was not written: the test proves nothing")
	require.Equal(t, int32(1), hits.Load())
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	require.Less(t, took, 4*time.Second, "a wait past the key window's end was started: RoundTrip returned %v on, the window being 4 s", took)
}
