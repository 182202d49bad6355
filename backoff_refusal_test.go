package idemretry_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// A BackOff factory that returns nil makes RoundTrip fail with
// ErrInvalidOption "before anything is sent". It must also leave nothing
// behind: a pending record would make a later Resume (or a resend) send a
// payment the app was told had failed.
func TestNilBackOffLeavesNoPendingAction(t *testing.T) {
	srv := newPayServer(t)
	for _, tc := range []struct {
		name string
		opts []idemretry.Option
		ctx  func(context.Context) context.Context
	}{
		{"WithBackOff", []idemretry.Option{idemretry.WithBackOff(func() backoff.BackOff { return nil })}, func(c context.Context) context.Context { return c }},
		{"RequestBackOff", nil, func(c context.Context) context.Context {
			return idemretry.WithRequestOptions(c, idemretry.RequestBackOff(func() backoff.BackOff { return nil }))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := journal.NewMemory()
			tr := transportOver(t, j, tc.opts...)
			for _, ctx := range []context.Context{idemretry.WithAction(context.Background(), "pay:"+tc.name), context.Background()} {
				_, err := tr.RoundTrip(post(t, tc.ctx(ctx), srv.URL, `{"order":"`+tc.name+`"}`))
				require.ErrorIs(t, err, idemretry.ErrInvalidOption)
			}
			left, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, left, "a request refused before anything was sent left a pending action, which Resume would send")
			assert.Empty(t, srv.seen())
			resp, err := tr.RoundTrip(mustGet(t, tc.ctx(context.Background()), srv.URL))
			if err == nil {
				resp.Body.Close()
			}
			assert.ErrorIs(t, err, idemretry.ErrInvalidOption, "a GET with the same BackOff")
		})
	}
}

func mustGet(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}
