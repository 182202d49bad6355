package idemretry

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// blockingMemory is a Memory journal whose claim never to block is not
// passed on (the Transport trusts it only from the journal itself): its
// calls get the journal timeout's bounds.
type blockingMemory struct{ *journal.Memory }

// Calls that start within a hundredth of the timeout share one timer's
// context; a call after that gets a new one, as does one with another
// timeout.
func TestSharedTimeoutsShareWithinTheSlack(t *testing.T) {
	var s sharedTimeouts
	a := s.bound(context.Background(), time.Hour)
	b := s.bound(context.Background(), time.Hour)
	require.Equal(t, a.Done(), b.Done(), "two calls at once made two timers")
	c := s.bound(context.Background(), 2*time.Hour)
	require.NotEqual(t, a.Done(), c.Done(), "another timeout shared the first's timer")

	s.cur.Load().reuseUntil = time.Now().Add(-time.Nanosecond) // the slack has passed
	d := s.bound(context.Background(), 2*time.Hour)
	require.NotEqual(t, c.Done(), d.Done(), "a call after the slack shared an old timer")
}

// A shared bound ends at its deadline, with context.DeadlineExceeded, and
// so does a context a journal derives from it; deriving one starts no
// goroutine of the context package (boundContext's Value leads it to the
// shared timer's own cancelCtx, of which it becomes a child).
func TestSharedBoundEndsAndLinksDerivedContexts(t *testing.T) {
	var s sharedTimeouts
	b := s.bound(context.Background(), timeoutShareMin)
	before := runtime.NumGoroutine()
	var cancels []context.CancelFunc
	for range 100 {
		_, cancel := context.WithCancel(b)
		cancels = append(cancels, cancel)
	}
	grew := runtime.NumGoroutine() - before
	derived, cancel := context.WithCancel(b)
	defer cancel()
	for _, c := range cancels {
		c()
	}
	require.Less(t, grew, 50, "deriving 100 contexts from a shared bound started %d goroutines", grew)
	select {
	case <-derived.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a context derived from a 100 ms shared bound did not end in 30 s")
	}
	require.ErrorIs(t, b.Err(), context.DeadlineExceeded)
	require.ErrorIs(t, context.Cause(b), context.DeadlineExceeded)
	require.ErrorIs(t, derived.Err(), context.DeadlineExceeded) // the parent's reason, as under a WithTimeout
}

// The journal bound of a request whose context has neither a deadline nor
// a Done channel costs one allocation, not a context.WithTimeout's five.
func TestJournalContextSharedCostsOneAllocation(t *testing.T) {
	tr, err := NewTransport(nil, WithJournal(blockingMemory{journal.NewMemory()}))
	require.NoError(t, err)
	defer tr.Close()
	ctx := WithAction(context.Background(), "pay:allocs")
	for name, f := range map[string]func(context.Context) (context.Context, context.CancelFunc){
		"journalContext": tr.journalContext, "outcomeContext": tr.outcomeContext,
	} {
		allocs := testing.AllocsPerRun(100, func() {
			c, cancel := f(ctx)
			_ = c.Done()
			cancel()
		})
		require.LessOrEqual(t, allocs, 1.0, "%s", name)
	}
}
