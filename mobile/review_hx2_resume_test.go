package idemretry_test

import (
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// maybePaid sends payment actionID (amount) while the server holds its
// answer, so that it ends KindMaybeProcessed after the server charged it,
// closes the Client (the app is gone) and returns the key charged.
func maybePaid(t *testing.T, srv *payServer, dir string, req *idemretry.Request) string {
	t.Helper()
	srv.setAfterCommit(holdUntilGone)
	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	req.TimeoutMillis = 1500
	_, err = c.Send(req)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	key := <-srv.committed
	require.NoError(t, c.Close())
	srv.setAfterCommit(nil)
	return key
}

// hX2's review: the app's next version sets an Idempotency-Key header of
// its own on its payment requests (its order's id, say), and its Rebuilder
// builds the request of a payment the previous version left pending,
// named by ActionID, the new way. Resume must not send that payment under
// another key than the one the server may have charged it under: the new
// key is a second charge. Nothing is sent, and the action stays pending.
func TestReviewHX2ResumeRebuiltWithAnotherKey(t *testing.T) {
	for name, withID := range map[string]bool{"id left empty": false, "same id": true} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			dir := filepath.Join(t.TempDir(), "idemretry")
			key := maybePaid(t, srv, dir, payment(srv, "pay:v1-order", "100"))

			c, err := idemretry.NewClient(dir, nil)
			require.NoError(t, err)
			defer c.Close()
			out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
				r := payment(srv, "", "100")
				if withID {
					r.ActionID = id
				}
				r.Headers.Set("Idempotency-Key", "order-v2-own-key")
				return r, nil
			}))
			require.NoError(t, err)
			require.EqualValues(t, 1, out.Len())
			o := out.Get(0)
			_, charges := srv.snapshot()
			assert.Equal(t, map[string]int{key: 1}, charges, "resumed under another key")
			require.Nil(t, o.Response)
			require.NotNil(t, o.Failure)
			assert.Equal(t, idemretry.KindInvalidRequest, o.Failure.Kind, o.Failure.Message)
			assert.Equal(t, "pay:v1-order", o.Failure.ActionID)
			assert.Equal(t, key, o.Failure.Key)
			assert.True(t, o.Failure.MaybeProcessed, "the action was sent before")

			l, err := c.Unfinished()
			require.NoError(t, err)
			require.EqualValues(t, 1, l.Len())
			assert.Equal(t, key, l.Get(0).Key)
		})
	}
}

// hX2's review: an action the app named with an Idempotency-Key header of
// its own is listed as "key:" and the key. A Rebuilder that leaves the
// header out (it rebuilds from the order, as the doc asks) gets the
// action sent under the listed key; before, Resume set ActionID to
// "key:...", which Send refuses, so such an action could never be resumed.
// A header that names another key is refused, nothing sent.
func TestReviewHX2ResumeOwnKeyAction(t *testing.T) {
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	req := payment(srv, "", "250")
	req.Headers.Set("Idempotency-Key", "app-key-77")
	key := maybePaid(t, srv, dir, req)
	require.Equal(t, "app-key-77", key)

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len())
	require.Equal(t, "key:app-key-77", l.Get(0).ActionID)

	// A header naming another key: refused, nothing sent.
	sent := srv.requestCount()
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		r := payment(srv, "", "250")
		r.Headers.Set("Idempotency-Key", "app-key-78")
		return r, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	require.NotNil(t, out.Get(0).Failure)
	assert.Equal(t, idemretry.KindInvalidRequest, out.Get(0).Failure.Kind, out.Get(0).Failure.Message)
	assert.Equal(t, sent, srv.requestCount())

	// The header left out: sent under the listed key, replayed.
	out, err = c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		return payment(srv, "", "250"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	require.NotNil(t, o.Response, "%+v", o.Failure)
	assert.True(t, o.Response.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// hX2's review: an action recorded outcome-unknown because the server
// refused its key as used for another payload (its key window far from
// over) is listed by Resume with the kind Send gives it,
// KindOutcomeUnknown, not KindWindowExpired ("the key is older than the
// key window").
func TestReviewHX2ResumeOutcomeUnknownKind(t *testing.T) {
	srv := newPayServer(t)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"title":"Idempotency-Key is already used"}`)
		return true
	})
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:reused", "300"))
	require.Equal(t, idemretry.KindOutcomeUnknown, kindOf(t, err), "%v", err)
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		t.Errorf("Rebuild(%q) called for an action whose outcome is unknown", id)
		return nil, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	assert.True(t, o.Skipped)
	require.NotNil(t, o.Failure)
	assert.Equal(t, idemretry.KindOutcomeUnknown, o.Failure.Kind, o.Failure.Message)
	assert.True(t, o.Failure.MaybeProcessed)
	assert.NotContains(t, o.Failure.Message, "window")
	assert.Equal(t, 1, srv.requestCount())
}

// hX2's review: a Rebuilder that returns a request with another method
// than POST or PATCH (the only ones journaled, so the only ones Resume
// lists) had it sent, without a key and unchecked against the action's
// fingerprint, and the action left pending as if nothing happened. It is
// refused, nothing sent.
func TestReviewHX2ResumeRebuiltWithUnkeyedMethod(t *testing.T) {
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	maybePaid(t, srv, dir, payment(srv, "pay:m", "100"))
	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	sent := srv.requestCount()
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		r := payment(srv, "", "100")
		r.Method = "PUT"
		return r, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	assert.Nil(t, o.Response)
	require.NotNil(t, o.Failure)
	assert.Equal(t, idemretry.KindFingerprintMismatch, o.Failure.Kind, o.Failure.Message)
	assert.True(t, o.Failure.MaybeProcessed)
	assert.Equal(t, sent, srv.requestCount(), "sent")
}
