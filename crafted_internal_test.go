package idemretry

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// The attempt builder sends no keyed method without a key, whatever the
// record it was given (issue 26, item 14: an empty key in a crafted record
// went out as a request without an Idempotency-Key); a method that is not
// keyed goes out without one.
func TestNewAttemptRefusesAKeyedMethodWithoutAKey(t *testing.T) {
	tr, err := NewTransport(nil, WithJournal(journal.NewMemory()), WithKeyedMethods(http.MethodGet), WithUnkeyedMethods(http.MethodPatch))
	require.NoError(t, err)
	defer tr.Close()
	for _, tc := range []struct {
		method string
		keyed  bool
	}{{http.MethodPost, true}, {http.MethodGet, true}, {"", true}, {http.MethodPatch, false}, {http.MethodPut, false}} {
		req, err := http.NewRequest(tc.method, "http://127.0.0.1:1/pay", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		req.Method = tc.method // "" is GET to net/http
		b, err := newBody(req, 1<<20)
		require.NoError(t, err)
		out, err := tr.newAttempt(req, &b, "", nil)
		if tc.keyed {
			require.ErrorIs(t, err, ErrInvalidKey, "%q without a key", tc.method)
			require.Nil(t, out)
		} else {
			require.NoError(t, err, "%q, which is not keyed", tc.method)
			require.Empty(t, out.Header.Values(DefaultKeyHeader))
		}
		b.close()
	}
}
