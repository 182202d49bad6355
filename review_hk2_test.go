package idemretry_test

// hK2's review: a pending action whose keyed fingerprint cannot be checked
// here (made under another secret: fingerprint.key deleted, the record
// copied from another journal) is refused "until its key window ends"
// (README, "What it stores"). After that it must go the way of every
// pending action past its window: recorded outcome-unknown, refused with
// ErrKeyWindowExpired, and handed to Resume's Resolve, never sent. It must
// not stay pending, refused as uncheckable, at every RoundTrip and every
// Resume for ever.

import (
	"bytes"
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

const uncheckableAction = "pay:hk2-large"

var uncheckableBody = bytes.Repeat([]byte("0123456789abcdef"), 80<<10/16) // 80 KiB: keyed

func uncheckableRequest(t testing.TB, ctx context.Context, url string) *http.Request {
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, uncheckableAction), http.MethodPost, url+"/charges", bytes.NewReader(uncheckableBody))
	require.NoError(t, err)
	return req
}

// foreignKeyedRecord returns the pending record of uncheckableAction made by a
// Transport over another Memory (another secret), whose attempt the server
// refused with a 503, on clk: a keyed fingerprint this journal cannot check.
func foreignKeyedRecord(t *testing.T, clk *fakeClock, url string) journal.Record {
	t.Helper()
	other := journal.NewMemory(journal.WithClock(clk.Now))
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(other), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(uncheckableRequest(t, context.Background(), url))
	if err == nil {
		readAll(t, resp)
	}
	recs, err := other.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	rec := recs[0]
	require.Equal(t, journal.StatePending, rec.State)
	if string(rec.Fingerprint[:4]) != "irk\x01" {
		t.Skip("this CPU makes plain fingerprints: nothing keyed to check")
	}
	return rec
}

type uncheckableResumer struct {
	t        *testing.T
	url      string
	resolved atomic.Int32
}

func (r *uncheckableResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return uncheckableRequest(r.t, ctx, r.url), nil
}

func (r *uncheckableResumer) Resolve(context.Context, journal.Record) (bool, error) {
	r.resolved.Add(1)
	return true, nil
}

// uncheckablePastWindow: a journal holding the foreign pending record, a Transport over
// it, and the server's count of requests with the record's key.
func uncheckablePastWindow(t *testing.T) (*idemretry.Transport, *journal.Memory, *fakeClock, journal.Record, *atomic.Int32, string) {
	var seen, wrong atomic.Int32
	var key atomic.Value
	key.Store("")
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if k := key.Load().(string); k != "" && r.Header.Get("Idempotency-Key") == k {
			seen.Add(1)
		} else if k != "" {
			wrong.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	t.Cleanup(func() { require.Zero(t, wrong.Load(), "a request under another key was sent") })
	clk := newFakeClock()
	rec := foreignKeyedRecord(t, clk, srv.URL)
	key.Store(rec.Key)
	j := journal.NewMemory(journal.WithClock(clk.Now))
	_, created, err := j.Reserve(context.Background(), rec, journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	base := &http.Transport{}
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, tr.Close())
		base.CloseIdleConnections()
	})
	// Within its window: refused as uncheckable, nothing sent (as the
	// earlier rounds tested).
	err = sendErr(tr, uncheckableRequest(t, context.Background(), srv.URL))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.Contains(t, err.Error(), "cannot be checked")
	require.ErrorIs(t, err, idemretry.ErrFingerprintUncheckable)
	require.Zero(t, seen.Load())
	clk.Advance(idemretry.DefaultKeyWindow + 2*time.Hour)
	return tr, j, clk, rec, &seen, srv.URL
}

func uncheckableState(t *testing.T, j *journal.Memory) journal.State {
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	if len(recs) == 0 {
		return 0
	}
	require.Len(t, recs, 1)
	return recs[0].State
}

// TestKeyWindowOfAnUncheckableActionRoundTrip: after its window, a
// RoundTrip of the action finds its key window ended, as for any pending
// action, and records it outcome-unknown.
//
// Found in review hk2 (2b5c04c; was TestReviewHK2UncheckablePastWindowRoundTrip).
func TestKeyWindowOfAnUncheckableActionRoundTrip(t *testing.T) {
	tr, j, _, _, seen, url := uncheckablePastWindow(t)
	err := sendErr(tr, uncheckableRequest(t, context.Background(), url))
	require.True(t, errors.Is(err, idemretry.ErrKeyWindowExpired), "past its key window: %v", err)
	require.Equal(t, journal.StateUnknown, uncheckableState(t, j), "left pending past its key window")
	require.Zero(t, seen.Load(), "sent")
}

// TestKeyWindowOfAnUncheckableActionResume: Resume hands it to Resolve
// once its window (and the settle time) have passed, and forgets it.
//
// Found in review hk2 (2b5c04c; was TestReviewHK2UncheckablePastWindowResume).
func TestKeyWindowOfAnUncheckableActionResume(t *testing.T) {
	tr, j, _, _, seen, url := uncheckablePastWindow(t)
	r := &uncheckableResumer{t: t, url: url}
	for round := 0; round < 2; round++ { // a second Resume finds what the first left
		res, err := tr.Resume(context.Background(), r, 1)
		require.NoError(t, err)
		if r.resolved.Load() > 0 {
			break
		}
		require.Len(t, res, 1)
		t.Logf("Resume %d: %v", round, res[0].Err)
	}
	require.EqualValues(t, 1, r.resolved.Load(), "never handed to Resolve: stuck pending for ever")
	require.Zero(t, uncheckableState(t, j), "not forgotten")
	require.Zero(t, seen.Load(), "sent")
}
