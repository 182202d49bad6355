package idemretry_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	root "github.com/idemretry/idemretry"
	idemretry "github.com/idemretry/idemretry/mobile"
)

// aheadClock is the system clock moved forward by d.
type aheadClock struct{ d time.Duration }

func (c aheadClock) Now() time.Time          { return time.Now().Add(c.d) }
func (c aheadClock) NewTimer() backoff.Timer { return &realTimer{} }

type realTimer struct{ t *time.Timer }

func (r *realTimer) Start(d time.Duration) { r.t = time.NewTimer(d) }
func (r *realTimer) Stop() {
	if r.t != nil {
		r.t.Stop()
	}
}
func (r *realTimer) C() <-chan time.Time { return r.t.C }

// A device whose clock ran two days ahead when the key was made, then was
// set right: the key's age cannot be known, so nothing is sent, and the
// app is told why.
func TestKindClockSkew(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	dir := filepath.Join(t.TempDir(), "idemretry")

	tr, err := root.NewTransport(nil, root.WithJournalDir(dir), root.WithClock(aheadClock{48 * time.Hour}))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(root.WithAction(context.Background(), "pay:skewed"), time.Second)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/charges", strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	_, err = (&http.Client{Transport: tr}).Do(hreq)
	require.Error(t, err)
	require.NoError(t, tr.Close())
	srv.setAfterCommit(nil)
	sent := srv.requestCount()

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Send(payment(srv, "pay:skewed", "5"))
	assert.Equal(t, idemretry.KindClockSkew, kindOf(t, err), "%v", err)
	assert.Equal(t, sent, srv.requestCount(), "a key from the future was sent")
	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len(), "the action must be kept")
}
