package idemretry_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hX2's review: a payment ends KindMaybeProcessed after the server charged
// it; then the journal fails (its directory was removed: a new payment
// fails first, and the journal stops). The resend of the first payment
// fails too, nothing sent, with KindJournal, and said MaybeProcessed
// false, "nothing can have reached the server": an app that
// trusts it lets the user pay again under a new action. It may have been
// charged: MaybeProcessed stays true. A new action, that the journal
// never held, still says false.
func TestReviewHX2JournalFailureKeepsMaybeProcessed(t *testing.T) {
	srv := newPayServer(t)
	c, dir := open(t, nil)
	key := chargedAnswerLost(t, srv, c, "pay:charged")

	require.NoError(t, os.RemoveAll(dir))
	_, err := c.Send(payment(srv, "pay:new", "100"))
	require.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	assert.False(t, idemretry.FailureOf(err).MaybeProcessed, "a new action")

	_, err = c.Send(payment(srv, "pay:charged", "100"))
	require.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed, "a payment the server charged: %s", f.Message)
	assert.Equal(t, "pay:charged", f.ActionID)
	if f.Key != "" {
		assert.Equal(t, key, f.Key)
	}
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// hX2's review: MaybeProcessed is about the action, whatever refused this
// Send of it. A payment charged by the server (KindMaybeProcessed), sent
// again with a mistake (a negative timeout), or after Close, was refused
// saying MaybeProcessed false, "nothing can have reached the server".
func TestReviewHX2RefusalKeepsMaybeProcessed(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)
	key := chargedAnswerLost(t, srv, c, "pay:charged")

	bad := payment(srv, "pay:charged", "100")
	bad.TimeoutMillis = -1
	_, err := c.Send(bad)
	require.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed, f.Message)
	assert.Equal(t, "pay:charged", f.ActionID)
	assert.Equal(t, key, f.Key)

	bad = payment(srv, "pay:never", "100")
	bad.TimeoutMillis = -1
	_, err = c.Send(bad)
	require.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	assert.False(t, idemretry.FailureOf(err).MaybeProcessed, "an action never sent")

	require.NoError(t, c.Close())
	_, err = c.Send(payment(srv, "pay:charged", "100"))
	require.Equal(t, idemretry.KindClosed, kindOf(t, err), "%v", err)
	f = idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed, "the journal, closed, cannot say")
	assert.Equal(t, "pay:charged", f.ActionID)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// chargedAnswerLost pays action through c, the server charging it and then
// holding the answer past the Send's timeout: KindMaybeProcessed. It
// returns the payment's key, and leaves the server answering again.
func chargedAnswerLost(t *testing.T, srv *payServer, c *idemretry.Client, action string) string {
	t.Helper()
	srv.setAfterCommit(holdUntilGone)
	r := payment(srv, action, "100")
	r.TimeoutMillis = 1500
	_, err := c.Send(r)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	srv.setAfterCommit(nil)
	return idemretry.FailureOf(err).Key
}
