package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// WithLeaseTTL: zero is the default, a negative value or one under a
// millisecond is refused by NewTransport.
func TestWithLeaseTTLValidated(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, time.Microsecond, time.Millisecond - 1} {
		_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithLeaseTTL(d))
		assert.ErrorIs(t, err, idemretry.ErrInvalidOption, "WithLeaseTTL(%v)", d)
	}
	for _, d := range []time.Duration{0, time.Millisecond, idemretry.DefaultLeaseTTL} {
		tr, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithLeaseTTL(d))
		if assert.NoError(t, err, "WithLeaseTTL(%v)", d) {
			tr.Close()
		}
	}
}

// A journal that is no journal.Leaser (the in-memory one) changes nothing:
// two Transports sharing it send one action alongside each other, as
// before leases, and the server answers the second 409 while the first is
// in progress. No goroutine is left behind.
func TestNoLeaserSendsAsBefore(t *testing.T) {
	if _, ok := any(journal.NewMemory()).(journal.Leaser); ok {
		t.Fatal("journal.Memory is a Leaser: this test needs a journal that is not")
	}
	srv := newPayServer(t)
	srv.delay = 500 * time.Millisecond
	arrived := make(chan int, 10)
	srv.arrived = arrived
	j := journal.NewMemory()
	newTr := func() *idemretry.Transport {
		tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j), idemretry.WithMaxRetries(0),
			idemretry.WithLeaseTTL(time.Hour))
		require.NoError(t, err)
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	a, b := newTr(), newTr()
	ctx := idemretry.WithAction(context.Background(), "pay:1")
	resA := make(chan int, 1)
	go func() {
		resp, err := a.RoundTrip(post(t, ctx, srv.URL, "order-1"))
		if err != nil {
			resA <- 0
			return
		}
		resp.Body.Close()
		resA <- resp.StatusCode
	}()
	<-arrived
	// Wait until A's charge is in progress at the server (arrived is sent
	// before the server marks the key in flight).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		srv.mu.Lock()
		busy := len(srv.inflight) > 0
		srv.mu.Unlock()
		if busy {
			break
		}
	}
	resp, err := b.RoundTrip(post(t, ctx, srv.URL, "order-1"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "B, sent alongside A")
	assert.True(t, errors.Is(idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted))
	assert.Equal(t, http.StatusCreated, <-resA)
	srv.requireOnePayment(t, 2)
	a.Close()
	b.Close()
	checkNoPackageGoroutines(t)
}

// A RoundTrip still in flight when Close is called releases its lease on
// its own path once it ends (bounded by its context and a second): Close
// has stopped waiting for releases, and none runs in a goroutine that
// outlives the Transport.
func TestLeaseReleaseAfterCloseLeavesNoGoroutine(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	j := &hangingRelease{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:after-close"), srv.URL, `{"amount":1}`))
	<-srv.arrived
	require.NoError(t, tr.Close())
	require.NoError(t, <-res)
	require.Equal(t, int32(1), j.ended.Load(), "RoundTrip returned after Close before its release ended")
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}
