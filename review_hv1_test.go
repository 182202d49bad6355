package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// detachedContext is the context an app detaches from a request's with
// its own type (as before context.WithoutCancel, e.g. x/tools' xcontext):
// it never ends and has no deadline, but its values, all of them, are its
// parent's.
type detachedContext struct{ parent context.Context }

func (detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detachedContext) Done() <-chan struct{}       { return nil }
func (detachedContext) Err() error                  { return nil }
func (d detachedContext) Value(k any) any           { return d.parent.Value(k) }

// remoteJournal is a Memory journal whose Reserve first asks a journal
// service over HTTP, with the call's context, as a journal that is a
// client of a remote store does; the service can hang.
type remoteJournal struct {
	*journal.Memory
	url    string
	client *http.Client
}

func (j *remoteJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.url, nil)
	if err != nil {
		return journal.Record{}, false, err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return journal.Record{}, false, err
	}
	resp.Body.Close()
	return j.Memory.Reserve(ctx, rec, mode)
}

// A caller's context that never ends, but whose values come from a request
// context that has ended (an app's own detached context), gets the journal
// timeout's shared bound. A journal call cut by that bound must be seen as
// the journal being unavailable (journal.ErrUnavailable, nothing sent),
// not as the caller's cancellation: the journal's HTTP client reports
// context.Cause of its request, which must be the timeout's, not the
// cause the ended request context left in the values.
func TestSharedBoundCauseIsTheTimeoutsUnderADetachedContext(t *testing.T) {
	hung := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	pay := newPayServer(t)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	j := &remoteJournal{Memory: journal.NewMemory(), url: hung.URL, client: client}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(200*time.Millisecond))

	reqCtx, cancel := context.WithCancel(context.Background())
	cancel() // the request that started the work has ended
	ctx := detachedContext{parent: reqCtx}

	start := time.Now()
	err := sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:detached"), pay.URL, `{"amount":3}`))
	took := time.Since(start)
	require.Error(t, err)
	require.Less(t, took, 20*time.Second, "the journal call outlasted its 200 ms timeout: %v", took)
	require.ErrorIs(t, err, journal.ErrUnavailable, "a journal call cut by the journal timeout is reported as %v", err)
	require.False(t, errors.Is(err, context.Canceled), "the caller's context was not cancelled, yet: %v", err)
	require.Equal(t, 0, pay.chargeCount(), "sent although the journal did not reserve the key")
}

// hangDoneJournal is a Memory journal whose first Update to done hangs
// until its context ends, and says on entered that it has begun.
type hangDoneJournal struct {
	*journal.Memory
	entered chan struct{}
	hung    atomic.Bool
}

func (h *hangDoneJournal) Update(ctx context.Context, rec journal.Record) error {
	if rec.State == journal.StateDone && h.hung.CompareAndSwap(false, true) {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Memory.Update(ctx, rec)
}

// README guarantee 5: only the write of the outcome being returned may
// outlast the caller's context, by at most OutcomeGrace. A caller whose
// context has no deadline and is cancelled while that write hangs gets
// RoundTrip back within OutcomeGrace of the cancel (here: well within the
// journal timeout of 20 s), and the outcome is kept and landed at Close.
func TestOutcomeWriteOutlastsACancelByOutcomeGraceAtMost(t *testing.T) {
	srv := newPayServer(t)
	j := &hangDoneJournal{Memory: journal.NewMemory(), entered: make(chan struct{}, 1)}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(20*time.Second))
	ctx, cancel := context.WithCancel(idemretry.WithAction(context.Background(), "pay:cancel-during-outcome"))
	defer cancel()
	cancelledAt := make(chan time.Time, 1)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-j.entered:
			cancelledAt <- time.Now()
			cancel()
		case <-finished:
		}
	}()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":5}`))
	returned := time.Now()
	if err == nil {
		resp.Body.Close()
	}
	var cancelled time.Time
	select {
	case cancelled = <-cancelledAt:
	default:
		t.Fatalf("RoundTrip returned (%v) before the outcome write began", err)
	}
	late := returned.Sub(cancelled)
	require.Less(t, late, 5*time.Second, "RoundTrip returned %v after its context was cancelled during the outcome write (OutcomeGrace %v)",
		late, idemretry.OutcomeGrace)
	require.Equal(t, 1, srv.chargeCount())
	require.NoError(t, tr.Close(), "Close lands the outcome the journal did not take in time")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Empty(t, un)
}
