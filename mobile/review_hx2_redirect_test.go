package idemretry_test

import (
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hX2's review: the server charges the payment and answers 303 See Other
// to the receipt, on a host that cannot be reached now (the network
// dropped). The payment was made: the Failure must say MaybeProcessed,
// not KindNetwork's "none of the attempts can have reached the server".
func TestReviewHX2ChargedThenRedirectFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := ln.Addr().String()
	require.NoError(t, ln.Close())

	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		http.Redirect(w, r, "http://"+gone+"/receipts/1", http.StatusSeeOther)
		return true
	})
	c, _ := open(t, nil)
	r := payment(srv, "pay:see-other", "100")
	r.TimeoutMillis = 2000
	_, err = c.Send(r)
	require.Error(t, err)
	f := idemretry.FailureOf(err)
	_, charges := srv.snapshot()
	require.Len(t, charges, 1, "the server charged")
	assert.True(t, f.MaybeProcessed, "kind %d: %s", f.Kind, f.Message)
	assert.Equal(t, idemretry.KindMaybeProcessed, f.Kind, f.Message)
	assert.Equal(t, "pay:see-other", f.ActionID)
	for k := range charges {
		assert.Equal(t, k, f.Key)
	}
	assert.EqualValues(t, 303, f.Status)

	// Sent again, as the kind says: the server's replay (this server
	// stores its charge's answer), no second charge.
	resp, err := c.Send(payment(srv, "pay:see-other", "100"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges = srv.snapshot()
	assert.Len(t, charges, 1)
}
