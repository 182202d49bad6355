package idemretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// retryingBase is a base transport that retries by itself, as a client
// wrapped twice would: up to tries requests per call, then it gives up,
// returning the last response with its error when keep is set (as
// go-retryablehttp's pass-through error handler does) or the error alone.
type retryingBase struct {
	inner http.RoundTripper
	tries int
	keep  bool
}

func (b *retryingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	var resp *http.Response
	for i := 0; i < b.tries; i++ {
		if i > 0 {
			resp.Body.Close()
			body, _ := r.GetBody()
			r = r.Clone(r.Context())
			r.Body = body
		}
		var err error
		if resp, err = b.inner.RoundTrip(r); err != nil {
			return nil, err
		}
		if resp.StatusCode < 500 {
			return resp, nil
		}
	}
	if b.keep {
		return resp, errors.New("base: giving up")
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, errors.New("base: giving up")
}

// Retries stacked on a base that retries by itself: every request written
// is counted, and the last status is kept when the base returns it.
func TestStackedRetriesCountedAndStatusKept(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	inner := &http.Transport{}
	defer inner.CloseIdleConnections()
	for _, keep := range []bool{false, true} {
		requests.Store(0)
		tr, err := idemretry.NewTransport(&retryingBase{inner: inner, tries: 5, keep: keep},
			idemretry.WithJournal(journal.NewMemory()), idemretry.WithMaxRetries(1), idemretry.WithRetryBudget(0, 0),
			idemretry.WithBackOff(constant(0)))
		require.NoError(t, err)
		_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:stacked"), srv.URL, "x"))
		var ae *idemretry.ActionError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, int32(10), requests.Load())
		assert.Equal(t, 10, ae.Attempts, "attempts report what reached the wire (keep=%v)", keep)
		if keep {
			assert.Equal(t, 503, ae.Status, "the base's last status is kept")
		}
		require.NoError(t, tr.Close())
	}
}
