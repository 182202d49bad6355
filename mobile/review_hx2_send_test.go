package idemretry_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hX2's review: a payment named by its ActionID may have been charged
// (KindMaybeProcessed); it is sent again, as the kind says, with the same
// ActionID, by code (a newer version of the app, a retry helper) that also
// sets an Idempotency-Key header of its own. The header names the action
// to the Transport, the ActionID is ignored, and the resend went out under
// a new key: a second charge. A request named both ways is refused before
// anything is sent, with KindInvalidRequest.
func TestReviewHX2ActionIDAndOwnKeyRefused(t *testing.T) {
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	key := maybePaid(t, srv, dir, payment(srv, "pay:both", "100"))

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	sent := srv.requestCount()
	r := payment(srv, "pay:both", "100")
	r.Headers.Set("idempotency-key", "order-own-key")
	_, err = c.Send(r)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges, "sent again under another key")
	assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	assert.Equal(t, sent, srv.requestCount())

	// Named one way, it is sent: the ActionID's resend is the replay.
	resp, err := c.Send(payment(srv, "pay:both", "100"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges = srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}
