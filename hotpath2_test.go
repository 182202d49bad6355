package idemretry_test

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// An attempt through an *http.Transport has no cancel of its own: a
// discarded body (a 503's) or an error body the policy peeks at (a 409's)
// that stalls is cut by closing it. Each way a net/http body can be read
// (HTTP/1, HTTP/1 decompressed by the Transport, HTTP/2), and a base that
// is not an *http.Transport (which keeps its per-attempt cancel), must cut
// the stalled read after DefaultMaxDrainTime: the server sees the stalled
// request end long before it would release it, and the retry is answered.
func TestStalledBodyIsCutOnEveryBase(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusConflict} {
		for _, kind := range []string{"http1", "http1-gzip", "http2", "wrapped"} {
			t.Run(http.StatusText(status)+"/"+kind, func(t *testing.T) {
				testStalledBodyIsCut(t, status, kind)
			})
		}
	}
}

func testStalledBodyIsCut(t *testing.T, status int, kind string) {
	release := make(chan struct{})
	cut := make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"charge":"ch_1"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		var body io.Writer = w
		var zw *gzip.Writer
		if kind == "http1-gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
			body = zw
		} else {
			w.Header().Set("Content-Length", "100000")
		}
		w.WriteHeader(status)
		io.WriteString(body, `{"error":{"code":"idempotency_key_in_use"`+strings.Repeat(" ", 100))
		if zw != nil {
			zw.Flush()
		}
		w.(http.Flusher).Flush()
		select { // the body stalls
		case <-release:
		case <-r.Context().Done():
			close(cut)
		}
	}))
	var base http.RoundTripper
	switch kind {
	case "http2":
		srv.EnableHTTP2 = true
		srv.StartTLS()
		base = srv.Client().Transport
		require.IsType(t, &http.Transport{}, base)
	case "wrapped":
		srv.Start()
		hb := &http.Transport{}
		defer hb.CloseIdleConnections()
		base = roundTripperFunc(hb.RoundTrip)
	default:
		srv.Start()
		hb := &http.Transport{}
		defer hb.CloseIdleConnections()
		base = hb
	}
	defer srv.Close()
	defer close(release)

	tr := retryTwiceOver(t, base)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:stalled-"+kind), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))
	select {
	case <-cut: // the stalled request was cut, not waited out
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled body was not cut")
	}
	require.EqualValues(t, 2, n.Load())
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// journalContext makes no timer of its own when the caller's deadline comes
// first: the journal call is then bounded by that deadline (the caller's
// own end, not an unavailable journal), and otherwise still by the journal
// timeout (journal.ErrUnavailable), both with nothing sent (guarantee 5).
func TestJournalCallBoundedByTheEarlierOfDeadlineAndTimeout(t *testing.T) {
	for _, tc := range []struct {
		name              string
		deadline, timeout time.Duration
		want              error
	}{
		{"deadline first", 300 * time.Millisecond, time.Minute, context.DeadlineExceeded},
		{"timeout first", time.Minute, 300 * time.Millisecond, journal.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
				idemretry.WithJournalTimeout(tc.timeout))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			_, err = tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:bounded"), srv.URL, `{"amount":1}`))
			elapsed := time.Since(start)
			require.ErrorIs(t, err, tc.want)
			if tc.want == context.DeadlineExceeded {
				require.NotErrorIs(t, err, journal.ErrUnavailable)
			}
			require.Less(t, elapsed, 20*time.Second)
			require.Empty(t, srv.seen())
		})
	}
}
