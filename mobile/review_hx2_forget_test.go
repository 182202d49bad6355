package idemretry_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hX2's review: the app's reconcile code forgets an action while a Send of
// it is in flight (the server, asked, had no charge yet: it was being
// made). The Send succeeds; the user taps again on the same checkout
// (same ActionID), which should get the replay, and got a new key: a
// second charge. Forget refuses an action being sent, nothing changed.
func TestReviewHX2ForgetWhileSending(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(300 * time.Millisecond)
		return false
	})
	c, _ := open(t, nil)
	done := make(chan error, 1)
	go func() {
		_, err := c.Send(payment(srv, "pay:f", "1"))
		done <- err
	}()
	key := <-srv.committed
	err := c.Forget("pay:f")
	assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	require.NoError(t, <-done)
	srv.setAfterCommit(nil)

	resp, err := c.Send(payment(srv, "pay:f", "1"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// hX2's review: Resume lists the unfinished actions, then sends them one
// by one; one of them is forgotten meanwhile (the app reconciled it: the
// server had charged it). Resume sent it anyway, as a new action under a
// new key: a second charge. An action forgotten since it was listed is
// not Resume's to bring back: skipped, nothing sent.
func TestReviewHX2ResumeSkipsForgotten(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, _ := open(t, nil)
	for _, id := range []string{"pay:1", "pay:2"} {
		r := payment(srv, id, "1")
		r.TimeoutMillis = 1000
		_, err := c.Send(r)
		require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	}
	srv.setAfterCommit(nil)
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		if id == "pay:1" {
			// Another thread reconciles pay:2 meanwhile: charged.
			require.NoError(t, c.Forget("pay:2"))
		}
		return payment(srv, "", "1"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 2, out.Len())
	require.NotNil(t, out.Get(0).Response)
	assert.True(t, out.Get(0).Response.Replayed)
	assert.Equal(t, "pay:2", out.Get(1).ActionID)
	assert.True(t, out.Get(1).Skipped)
	assert.Nil(t, out.Get(1).Response, "a forgotten action was sent again")
	_, charges := srv.snapshot()
	assert.Len(t, charges, 2)
	for k, n := range charges {
		assert.Equal(t, 1, n, "key %s", k)
	}
}

// hX2's review: the same, with the Forget made while Resume rebuilds the
// action itself: refused, and the action is resumed under its key.
func TestReviewHX2ForgetWhileResuming(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, _ := open(t, nil)
	r := payment(srv, "pay:r", "1")
	r.TimeoutMillis = 1000
	_, err := c.Send(r)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	key := idemretry.FailureOf(err).Key
	srv.setAfterCommit(nil)
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		err := c.Forget(id)
		assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
		return payment(srv, "", "1"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	require.NotNil(t, out.Get(0).Response, "%+v", out.Get(0).Failure)
	assert.True(t, out.Get(0).Response.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}
