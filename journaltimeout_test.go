package idemretry_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// ctxSpy is a Memory journal (whose NeverBlocks claim it does not pass on)
// that notes, for each Reserve and Update, the deadline its context
// reported, when it was called, and the value under spyKey.
type ctxSpy struct {
	*journal.Memory
	mu    sync.Mutex
	calls []spiedCall
}

type spiedCall struct {
	op       string
	at       time.Time
	deadline time.Time
	hasDL    bool
	value    any
}

type spyKey struct{}

func (s *ctxSpy) note(ctx context.Context, op string) {
	dl, ok := ctx.Deadline()
	s.mu.Lock()
	s.calls = append(s.calls, spiedCall{op: op, at: time.Now(), deadline: dl, hasDL: ok, value: ctx.Value(spyKey{})})
	s.mu.Unlock()
}

func (s *ctxSpy) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	s.note(ctx, "reserve")
	return s.Memory.Reserve(ctx, rec, mode)
}

func (s *ctxSpy) Update(ctx context.Context, rec journal.Record) error {
	s.note(ctx, "update")
	return s.Memory.Update(ctx, rec)
}

// A request whose context has neither a deadline nor a Done channel gets
// shared journal bounds (one timer for the calls made within a hundredth of
// the journal timeout): each journal call still sees the caller's values,
// and a deadline no later than the journal timeout from its start and no
// earlier than 99 % of it.
func TestSharedJournalBoundKeepsValuesAndTheTimeout(t *testing.T) {
	const timeout = 10 * time.Second
	srv := newPayServer(t)
	spy := &ctxSpy{Memory: journal.NewMemory()}
	tr := transportOver(t, spy, idemretry.WithJournalTimeout(timeout))
	ctx := context.WithValue(context.Background(), spyKey{}, "trace-7")
	for i, body := range []string{`{"amount":1}`, `{"amount":2}`} {
		start := time.Now()
		roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:spied-"+body), srv.URL, body))
		end := time.Now()
		spy.mu.Lock()
		calls := spy.calls
		spy.calls = nil
		spy.mu.Unlock()
		var ops []string
		for _, c := range calls {
			ops = append(ops, c.op)
			require.Equal(t, "trace-7", c.value, "action %d: %s lost the caller's value", i, c.op)
			require.True(t, c.hasDL, "action %d: %s has no deadline", i, c.op)
			require.False(t, c.deadline.After(c.at.Add(timeout)), "action %d: %s bounded past the journal timeout", i, c.op)
			require.False(t, c.deadline.Before(start.Add(timeout-timeout/100)), "action %d: %s cut more than 1%% short", i, c.op)
			require.False(t, c.deadline.After(end.Add(timeout)), "action %d: %s", i, c.op)
		}
		require.Contains(t, ops, "reserve")
		require.Contains(t, ops, "update")
	}
	require.Equal(t, 2, srv.chargeCount())
}

// An outcome write that hangs, under a caller's context.Background, is cut
// by the journal timeout through its shared bound: RoundTrip returns the
// answer, the outcome is kept in memory, and Close lands it.
func TestSharedJournalBoundCutsAHangingOutcomeWrite(t *testing.T) {
	srv := newPayServer(t)
	j := &flakyJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(200*time.Millisecond))
	j.hang.Store(true)
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":8}`))
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	resp.Body.Close()
	require.Less(t, took, 20*time.Second, "RoundTrip waited %v on a journal timeout of 200 ms", took)
	j.hang.Store(false)
	require.NoError(t, tr.Close(), "Close lands the outcome the journal did not take in time")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Empty(t, un)
	require.Equal(t, 1, srv.chargeCount())
}
