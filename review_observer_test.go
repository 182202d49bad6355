package idemretry_test

// the review of d38ace4 (EventAttempt made only when there are
// observers): every observer still hears of every attempt, with its
// number, status, error and elapsed time, over real loopback HTTP.

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

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
