package idemretry_test

// the review's review of 5a75ef1: a Lease that succeeds after the caller's
// deadline has passed.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// slowLeaseGranted is a Leaser over Memory whose Lease takes slow (a
// database under load that does not watch the context) and then grants
// the lease.
type slowLeaseGranted struct {
	*journal.Memory
	slow   time.Duration
	leases atomic.Int32
}

func (j *slowLeaseGranted) Lease(_ context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	j.leases.Add(1)
	time.Sleep(j.slow)
	return true, time.Now().Add(ttl), nil
}

func (j *slowLeaseGranted) Release(context.Context, string, string) error { return nil }

// 5a75ef1: "a Lease call the caller's context ended sends nothing". A
// Lease that returns held after the caller's deadline has passed: the
// action must not be sent after the deadline. With a context that has a
// deadline and no Done, nothing in net/http can see the deadline either.
//
// Found in the second review of leases (5062b32; was TestReviewLeaseGrantedAfterTheCallersDeadlineSendsNothing).
func TestLeaseGrantedAfterTheCallersDeadlineSendsNothing(t *testing.T) {
	for _, tc := range deadlineContexts(200 * time.Millisecond) {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := &slowLeaseGranted{Memory: journal.NewMemory(), slow: 500 * time.Millisecond}
			tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			err = <-sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:r3-slowlease"), srv.URL, `{"amount":1}`))
			require.Equal(t, int32(1), j.leases.Load())
			require.Empty(t, srv.seen(), "sent after the caller's deadline (error: %v)", err)
			require.ErrorIs(t, err, context.DeadlineExceeded)
		})
	}
}

// slowReserve is a blocking journal whose Reserve takes slow (not
// watching its context) and then succeeds: no leases.
type slowReserve struct {
	*journal.Memory
	slow time.Duration
}

func (j slowReserve) Reserve(_ context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	time.Sleep(j.slow)
	return j.Memory.Reserve(context.Background(), rec, mode)
}

// The same without leases: a Reserve that succeeds after the deadline of a
// context without Done sends nothing either (attempts checks the deadline
// that nothing else can signal).
//
// Found in the second review of leases (5062b32; was TestReviewReserveAfterTheDeadlineWithoutDoneSendsNothing).
func TestReserveAfterTheDeadlineWithoutDoneSendsNothing(t *testing.T) {
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(slowReserve{journal.NewMemory(), 500 * time.Millisecond}))
	require.NoError(t, err)
	defer tr.Close()
	ctx := noDoneContext{context.Background(), time.Now().Add(200 * time.Millisecond)}
	err = <-sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:r3-slowreserve"), srv.URL, `{"amount":1}`))
	require.Empty(t, srv.seen(), "sent after the caller's deadline (error: %v)", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
