package idemretry_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Two machines share one journal (sqljournal; here a journal.Memory that
// both Transports use, as in review2). Machine A's request of pay:A is at
// the server when its key window ends. Machine B runs Resume: it lists
// pay:A pending, and its rebuilt request's Reserve reads it pending, past
// its window. Just then A's answer arrives (201, charged): A records pay:A
// done, which is final. B's reserve then records it unknown: the journal
// keeps it done (Update "may then change Attempts only, and returns nil"),
// but reserve sets mark.unknown all the same, and Resume hands the DONE
// action to Resolve, which forgets it. The done record that would have
// refused a stale tap of pay:A (ErrKeyWindowExpired, nothing sent) is gone:
// the tap is charged again under a new key.
//
// Found in review 3 of Resume (506577d; was TestReview3ResumeResolvesAnActionAnotherMachineFinished).
func TestReconcileAnActionAnotherMachineFinished(t *testing.T) {
	const window = 1500 * time.Millisecond
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	arrived, unblock := slowFirstCharge(t, srv)
	j := &pausingJournal{Journal: journal.NewMemory()}
	trA := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	trB := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	live := sendAsync(trA, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	<-arrived
	time.Sleep(window + 300*time.Millisecond) // A's window ends while its attempt is at the server

	var liveErr error
	j.mu.Lock()
	j.after = func(_, got journal.Record, created bool) {
		// B's Reserve has read pay:A pending: A's answer arrives now.
		if created || got.State != journal.StatePending {
			return
		}
		unblock()
		liveErr = <-live
	}
	j.mu.Unlock()
	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	res, err := trB.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, liveErr, "A gets its final answer")
	t.Logf("B's resume: sent=%v forgotten=%v err=%v; resolved %d", res[0].Sent, res[0].Forgotten, res[0].Err, len(app.resolved))

	// A stale screen taps pay:A again.
	err = sendErr(trA, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	t.Logf("stale tap of pay:A: %v", err)
	assert.Empty(t, app.resolved, "Resume handed pay:A to Resolve, and forgot it, when the journal held it done")
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once")
}

// Two machines share one journal (as above). Resume on machine B lists
// pay:A pending under key K1, whose window has ended (the provider never
// saw K1). B's rebuilt request's Reserve reads it pending; just then
// machine C, which reconciled pay:A (no charge under K1), forgets it, and
// its user pays order A again through machine A: a new action under K2,
// at the server. B's reserve then records K1 unknown: the journal has no
// record under K1 (ErrNotFound, dropped), but mark.unknown is set all the
// same, Resolve is told K1 was not charged, and Resume forgets pay:A by its
// id: it erases K2's record, with K2's request in the air. The app pays
// order A again (K3); K2's charge lands too.
//
// Found in review 3 of Resume (506577d; was TestReview3ResumeForgetErasesTheActionThatReplacedIt).
func TestReconcileForgetSparesTheActionThatReplacedIt(t *testing.T) {
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	j := &pausingJournal{Journal: journal.NewMemory()}
	listed := pendingPayA(t, srv, j, body)
	arrived, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	srv.mu.Lock()
	srv.script = func(_ int, _ http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Idempotency-Key") != listed.Key && r.Header.Get("X-Machine") == "A" {
			close(arrived)
			<-release // K2's charge is slow
		}
		return false
	}
	srv.mu.Unlock()
	trA := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	trB := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond) // K1's window has ended

	live := make(chan error, 1)
	var k2 string
	j.mu.Lock()
	j.after = func(_, got journal.Record, created bool) {
		if created || got.Key != listed.Key {
			return
		}
		// Machine C reconciled pay:A and forgot it; its user pays again
		// through machine A.
		assert.NoError(t, j.Journal.Forget(ctx, "pay:A"))
		go func() {
			req := post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)
			req.Header.Set("X-Machine", "A")
			resp, err := trA.RoundTrip(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			live <- err
		}()
		<-arrived
		if recs, err := j.Journal.Unfinished(ctx); assert.NoError(t, err) && assert.Len(t, recs, 1) {
			k2 = recs[0].Key
		}
	}
	j.mu.Unlock()
	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	res, err := trB.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	t.Logf("B's resume of K1 %s: sent=%v forgotten=%v err=%v", listed.Key, res[0].Sent, res[0].Forgotten, res[0].Err)
	recs, err := j.Journal.Unfinished(ctx)
	require.NoError(t, err)
	t.Logf("journal after Resume: %+v (K2 %s in the air)", recs, k2)
	held := len(recs) == 1 && recs[0].Key == k2

	for _, id := range app.repay { // the provider had no charge under K1
		resp, err := trB.RoundTrip(post(t, idemretry.WithAction(ctx, id), srv.URL, body))
		if err == nil {
			readAll(t, resp)
		}
	}
	unblock()
	require.NoError(t, <-live)
	assert.True(t, held, "Resume's Forget of K1's action erased the record of K2, a request of which was in the air")
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once")
}

// Machine A's request of pay:A is at the server when its key window ends.
// Machine B, sharing the journal, sends pay:A too: its reserve finds the
// window ended and records the action outcome-unknown (nothing sent).
// Machine A then runs Resume ("safe while the Transport serves other
// requests"): it lists pay:A unknown and hands it to Resolve at once,
// without looking at the flight of pay:A in the air in its own Transport
// (README: "one flight per action"). The provider has no charge under the
// key yet, so the app forgets the action and pays again; A's request is
// then charged too.
//
// Found in review 3 of Resume (506577d; was TestReview3ResumeResolvesAListedUnknownActionInFlightHere).
func TestReconcileAListedUnknownActionInFlightHere(t *testing.T) {
	const window = 1500 * time.Millisecond
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	arrived, unblock := slowFirstCharge(t, srv)
	j := journal.NewMemory()
	trA := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	trB := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	live := sendAsync(trA, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	<-arrived
	time.Sleep(window + 300*time.Millisecond) // A's window ends while its attempt is at the server
	require.ErrorIs(t, sendErr(trB, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	done := resumeAsync(ctx, trA, app, 0)
	// Resume either waits for the flight in the air or resolves at once.
	var o resumed
	select {
	case o = <-done:
	case <-time.After(2 * time.Second):
	}
	app.mu.Lock()
	resolvedInFlight := len(app.resolved) > 0
	app.mu.Unlock()
	unblock()
	if o.res == nil {
		o = <-done
	}
	require.NoError(t, o.err)
	require.NoError(t, <-live, "A's request gets its final answer")
	require.Len(t, o.res, 1)
	t.Logf("A's resume: forgotten=%v err=%v; resolved while A's request was at the server: %v", o.res[0].Forgotten, o.res[0].Err, resolvedInFlight)
	for _, id := range app.repay {
		resp, err := trA.RoundTrip(post(t, idemretry.WithAction(ctx, id), srv.URL, body))
		if err == nil {
			readAll(t, resp)
		}
	}
	assert.False(t, resolvedInFlight, "Resume handed pay:A to Resolve (and forgot it) while a request of it was in flight in this Transport")
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once")
}
