package idemretry_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/hammer"
)

// recorder collects events.
type recorder struct {
	mu     sync.Mutex
	events []idemretry.Event
}

func (r *recorder) observe(e idemretry.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.Kind.String())
	}
	return out
}

// Each event is reported once, in order, with the action, its key and the
// reason; the counters agree.
func TestObserverEvents(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	rec := &recorder{}
	tr, _, clk := newTestTransport(t, idemretry.WithObserver(rec.observe), idemretry.WithMaxRetries(1))
	ctx := idemretry.WithAction(context.Background(), "pay:obs")
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
	assert.Equal(t, []string{"reserve", "attempt", "retry", "attempt", "done"}, rec.kinds())
	last := rec.events[len(rec.events)-1]
	assert.Equal(t, "pay:obs", last.Action)
	assert.Equal(t, srv.seen()[0].Key, last.Key)
	assert.Equal(t, 2, last.Attempt)
	assert.False(t, last.Replayed)

	// The same action again: a replay.
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))
	assert.True(t, rec.events[len(rec.events)-1].Replayed)

	// A give-up, and the key window ending.
	down := newPayServer(t)
	down.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool { status(503)(w); return true }
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:obs2"), down.URL, "y"))
	assert.Equal(t, "give-up", rec.kinds()[len(rec.kinds())-1])
	assert.Equal(t, idemretry.ErrAttemptsExhausted, rec.events[len(rec.events)-1].Reason)
	clk.Advance(25 * time.Hour)
	_, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:obs2"), down.URL, "y"))
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Equal(t, "unknown", rec.kinds()[len(rec.kinds())-1])

	st := tr.Stats()
	assert.Equal(t, int64(len(srv.seen())+len(down.seen())), st.Attempts)
	assert.Equal(t, int64(2), st.Done)
	assert.Equal(t, int64(1), st.Replays)
	assert.Equal(t, int64(1), st.GiveUpsExhausted)
	assert.Equal(t, int64(1), st.Unknown)
	assert.Equal(t, int64(2), st.Retries)
	assert.Positive(t, st.Reserves)
	// The events add up to the counters: requests written, and each
	// reservation and sync with its time.
	var requests, reserves, syncs int64
	var reserveTime, syncTime time.Duration
	for _, e := range rec.events {
		switch e.Kind {
		case idemretry.EventAttempt:
			requests += int64(e.Requests)
		case idemretry.EventReserve:
			reserves++
			reserveTime += e.Elapsed
		case idemretry.EventSync:
			syncs++
			syncTime += e.Elapsed
		}
	}
	assert.Equal(t, st.Attempts, requests, "Requests of the attempt events")
	assert.Equal(t, st.Reserves, reserves, "reserve events")
	assert.Equal(t, st.ReserveTime, reserveTime, "Elapsed of the reserve events")
	assert.Equal(t, st.Syncs, syncs, "sync events")
	assert.Equal(t, st.SyncTime, syncTime, "Elapsed of the sync events")
}

// A panicking observer cannot break a RoundTrip: it is recovered and logged.
func TestPanickingObserver(t *testing.T) {
	srv := newPayServer(t)
	var logs bytes.Buffer
	tr, _, _ := newTestTransport(t, idemretry.WithObserver(func(idemretry.Event) { panic("observer bug") }),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	resp := roundTrip(t, tr, post(t, context.Background(), srv.URL, "x"))
	assert.Equal(t, 201, resp.StatusCode)
	assert.Contains(t, logs.String(), "observer panicked")
	assert.Equal(t, 1, srv.chargeCount())
}

// The counters stay consistent under concurrent use (run with -race).
func TestStatsConcurrent(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n%3 == 0 {
			w.WriteHeader(503)
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t, idemretry.WithRetryBudget(0, 0))
	hammer.Run(8, 20, func(g, i int) {
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, fmt.Sprint(g, "-", i)))
		if assert.NoError(t, err) {
			readAll(t, resp)
		}
	})
	st := tr.Stats()
	assert.Equal(t, int64(len(srv.seen())), st.Attempts)
	assert.Equal(t, st.Attempts-160, st.Retries)
	assert.Equal(t, int64(160), st.Done+st.GiveUpsExhausted)
}

// Logs are quiet for a normal retry, warn when an action gives up, is
// parked or its window ends, and never carry a body or a credential;
// neither does the journal on disk.
func TestLogsAndJournalHoldNoSecrets(t *testing.T) {
	t.Parallel()
	const secret, marker = "Bearer sk_live_SECRET123", "BODY-MARKER-4242"
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	var logs bytes.Buffer
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir),
		idemretry.WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(1), idemretry.WithRetryBudget(1, 0))
	require.NoError(t, err)
	send := func(body string) {
		req := post(t, context.Background(), srv.URL, `{"card":"`+marker+`","n":"`+body+`"}`)
		req.Header.Set("Authorization", secret)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			readAll(t, resp)
		}
	}
	send("1") // a normal retry: Debug only
	warns := strings.Count(logs.String(), `"level":"WARN"`)
	assert.Zero(t, warns, "a normal retry warned: %s", logs.String())
	srv.script = func(_ int, w http.ResponseWriter, _ *http.Request) bool { status(503)(w); return true }
	send("2") // gives up, the budget (one token, refilled by nothing) now empty
	send("3") // parked
	assert.GreaterOrEqual(t, strings.Count(logs.String(), `"level":"WARN"`), 2)
	require.NoError(t, tr.Close())

	for _, s := range []string{secret, "sk_live", marker} {
		assert.NotContains(t, logs.String(), s)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range []string{secret, "sk_live", marker} {
			assert.NotContains(t, string(b), s, f)
		}
	}
}

// the review of d38ace4 (EventAttempt made only when there are
// observers): every observer still hears of every attempt, with its
// number, status, error and elapsed time, over real loopback HTTP.

type attemptEvents struct {
	mu sync.Mutex
	ev []idemretry.Event
}

func (e *attemptEvents) observe(ev idemretry.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ev = append(e.ev, ev)
}

func (e *attemptEvents) attempts() []idemretry.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []idemretry.Event
	for _, ev := range e.ev {
		if ev.Kind == idemretry.EventAttempt {
			out = append(out, ev)
		}
	}
	return out
}

// Found in the review of journalError (8fea022; was TestReviewObserversSeeEveryAttempt).
func TestObserverSeesEveryAttempt(t *testing.T) {
	t.Parallel()
	const delay = 30 * time.Millisecond
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		switch n.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			hijackAndClose(w) // a transport error, after the request was written
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	var first, second attemptEvents
	// No keep-alive: net/http would otherwise resend the request cut on a
	// reused connection by itself (one attempt, two writes).
	base := &http.Transport{DisableKeepAlives: true}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, inMemory(), idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(3),
		idemretry.WithObserver(func(idemretry.Event) { panic("a broken observer") }),
		idemretry.WithObserver(first.observe), idemretry.WithObserver(second.observe))
	require.NoError(t, err)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(idemretry.WithAction(context.Background(), "pay:rv-obs"), 20*time.Second)
	defer cancel()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 3, n.Load())
	require.EqualValues(t, 3, tr.Stats().Attempts)
	for _, e := range []*attemptEvents{&first, &second} {
		at := e.attempts()
		require.Len(t, at, 3, "EventAttempts seen")
		for i, ev := range at {
			require.Equal(t, i+1, ev.Attempt)
			require.Equal(t, "pay:rv-obs", ev.Action)
			require.NotEmpty(t, ev.Key)
			require.Equal(t, at[0].Key, ev.Key)
			require.GreaterOrEqual(t, ev.Elapsed, delay, "attempt %d: Elapsed", i+1)
			require.Less(t, ev.Elapsed, 10*time.Second)
		}
		require.Equal(t, http.StatusServiceUnavailable, at[0].Status)
		require.NoError(t, at[0].Err)
		require.Equal(t, 0, at[1].Status)
		require.Error(t, at[1].Err)
		require.Equal(t, http.StatusCreated, at[2].Status)
		require.NoError(t, at[2].Err)
	}
}
