package idemretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// Resume's reconciliation of the actions it may not send (reconcile.go):
// Resolve is asked only while no request of the action can be in the air,
// and a forget erases only the record it judged.

// providerResumer is an app that reconciles an action by asking the
// payment provider (the test server) whether its key was charged: if it
// was, the order is paid and the action may be forgotten; if it was not,
// the action may be forgotten too and the app pays the order again later
// (repay). Rebuild returns the one order's request.
type providerResumer struct {
	srv      *payServer
	url      string
	body     string
	mu       sync.Mutex
	resolved []journal.Record
	repay    []string // action ids the provider had no charge for
	// gate, if set, holds Resolve of gateID until closed, after saying so
	// on resolving.
	gateID    string
	resolving chan struct{}
	gate      chan struct{}
}

func (p *providerResumer) Rebuild(ctx context.Context, _ journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, p.url, stringsReader(p.body))
}

func (p *providerResumer) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	if p.gate != nil && rec.ActionID == p.gateID {
		close(p.resolving)
		<-p.gate
	}
	charged := p.srv.charged(rec.Key)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resolved = append(p.resolved, rec)
	if !charged {
		p.repay = append(p.repay, rec.ActionID)
	}
	return true, nil
}

// A request of pay:A is at the server (slow to answer) when its key window
// ends; Resume runs meanwhile in the same Transport (README: "Resume is
// safe while the Transport serves other requests"). Resume lists pay:A
// pending, and Transport.expire (new in 1d85888) marks it outcome-unknown
// and hands it to Resolve WITHOUT looking at the flight in the air ("one
// flight per action"): the provider has no charge for the key yet, so the
// app is told to forget it and pays again. The live request then gets its
// 201 (charged), whose done record finds no record (ErrNotFound, dropped).
// Result: two charges for one order. Before 1d85888 the expired pending
// action went through RoundTrip and joined the live flight.
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeExpireDoesNotResolveAnActionInFlight).
func TestReconcileExpireDoesNotResolveAnActionInFlight(t *testing.T) {
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	arrived, unblock := slowFirstCharge(t, srv)
	tr := transportOver(t, journal.NewMemory(), idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	live := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	<-arrived
	time.Sleep(window + 300*time.Millisecond) // the key window ends while the attempt is at the server

	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	done := resumeAsync(ctx, tr, app, 0)
	// Resume either joins the flight in the air or (wrongly) resolves the
	// action at once; give it time to do either.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(goroutineStacks(), "(*flights).wait") {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	app.mu.Lock()
	inFlightWhenResolved := len(app.resolved) > 0
	app.mu.Unlock()
	unblock()
	o := <-done
	res, err := o.res, o.err
	require.NoError(t, err)
	require.NoError(t, <-live, "the live request gets its final answer")
	require.Len(t, res, 1)
	t.Logf("resume: forgotten=%v sent=%v err=%v; resolved while the request was at the server: %v", res[0].Forgotten, res[0].Sent, res[0].Err, inFlightWhenResolved)

	// The app does what Resolve's answer told it: the provider had no
	// charge under the key, the action is forgotten, so it pays again.
	for _, id := range app.repay {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, id), srv.URL, body))
		if err == nil {
			readAll(t, resp)
		}
	}
	assert.False(t, inFlightWhenResolved, "Resume handed pay:A to Resolve (and forgot it) while a request of it was in flight in this Transport")
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once")
}

// Resume lists pay:A pending, its window not yet ended. While Resume is busy
// with an older action (concurrency 1, a slow Resolve), the app's own resend
// of pay:A finishes it under its key (a replay: done, final). pay:A's window
// then ends before Resume comes to it. Resume judges the stale listed
// record, not the journal: expire records it unknown (the journal keeps it
// done) and hands a DONE action to Resolve, which forgets it: the done
// record that refused a later request of pay:A (ErrKeyWindowExpired,
// nothing sent) is gone, and a stale screen's tap on pay:A is charged again
// under a new key. README: done "is then final"; Resolve is for "an action
// whose outcome is unknown".
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeExpireDoesNotForgetADoneAction).
func TestReconcileExpireDoesNotForgetADoneAction(t *testing.T) {
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true, 2: true} // both charged, answers lost
	tr, _, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	require.Error(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:0"), srv.URL, body))) // the app rebuilds one body for both
	clk.Advance(time.Hour)
	require.Error(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)))
	clk.Advance(idemretry.DefaultKeyWindow - time.Hour + time.Minute) // pay:0's window has ended, pay:A's has 59 min left

	app := &providerResumer{srv: srv, url: srv.URL, body: body, gateID: "pay:0", resolving: make(chan struct{}), gate: make(chan struct{})}
	done := resumeAsync(ctx, tr, app, 1)
	<-app.resolving
	// Meanwhile the app resends pay:A: its key, a replay, done.
	resp := roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	clk.Advance(2 * time.Hour) // pay:A's window ends before Resume comes to it
	close(app.gate)
	res := (<-done).res
	require.Len(t, res, 2)
	t.Logf("pay:A: forgotten=%v sent=%v err=%v; resolved %d", res[1].Forgotten, res[1].Sent, res[1].Err, len(app.resolved))
	assert.False(t, res[1].Forgotten, "Resume resolved and forgot pay:A, whose record was done")

	// A stale screen taps pay:A again: a done record past its window refuses it.
	err := sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	t.Logf("repeat of pay:A: %v", err)
	assert.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Equal(t, 2, srv.chargeCount(), "order A charged twice: its done record was forgotten")

}

// slowRebuild is an app whose Rebuild of pay:A takes long: while it runs,
// meanwhile happens (the app's own resend finishing the action, then the
// clock passing the key window's end).
type slowRebuild struct {
	*providerResumer
	meanwhile func()
}

func (s *slowRebuild) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	s.meanwhile()
	return s.providerResumer.Rebuild(ctx, rec)
}

// The other road to the same loss as TestReconcileExpireDoesNotForgetADoneAction:
// pay:A is within its window when Resume comes to it (so expire leaves it
// to Rebuild), the app's own resend finishes it (done) while Rebuild runs,
// and the window ends before the rebuilt request is reserved. The reserve
// refuses the done action with ErrKeyWindowExpired, which resumeOne takes
// for "the action is outcome-unknown now" and hands to Resolve, which
// forgets the done record; a later tap on pay:A is charged again.
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeKeyWindowRefusalDoesNotForgetADoneAction).
func TestReconcileKeyWindowRefusalDoesNotForgetADoneAction(t *testing.T) {
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true} // charged, answer lost
	tr, _, clk := newTestTransport(t, idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.Error(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)))
	clk.Advance(idemretry.DefaultKeyWindow - time.Hour)

	app := &slowRebuild{providerResumer: &providerResumer{srv: srv, url: srv.URL, body: body}}
	app.meanwhile = func() {
		resp := roundTrip(t, tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)) // the app's own resend: a replay, done
		require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
		clk.Advance(2 * time.Hour)
	}
	res, err := tr.Resume(ctx, app, 0)
	require.NoError(t, err)
	require.Len(t, res, 1)
	t.Logf("pay:A: forgotten=%v sent=%v err=%v", res[0].Forgotten, res[0].Sent, res[0].Err)
	assert.False(t, res[0].Forgotten, "Resume resolved and forgot pay:A, whose record was done")

	err = sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	t.Logf("repeat of pay:A: %v", err)
	assert.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.Equal(t, 1, srv.chargeCount(), "order A charged twice: its done record was forgotten")
}

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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// A request of pay:A reached the provider, which is slow to process it
// (its charge is made once released). The caller gives up (its context
// ends: a client timeout, or the process is killed and restarted): the
// RoundTrip returns, its flight lands, the action is left pending, and
// nothing in the Transport or the journal remembers that a request of it
// is still being processed. Its key window then ends (an attempt may start
// up to the window's end). Resume lists pay:A pending; its rebuilt request
// records it outcome-unknown, and Resume hands it to Resolve at once: no
// flight, no lease, the record is unknown under its key. The provider has
// no charge under the key yet, so the app forgets pay:A and pays again;
// then the abandoned request's charge is made too. README: "Resolve is
// called only while no request of the action can be in the air".
//
// Found in review 4 of Resume (fefbf4b; was TestReview4ResumeResolvesWhileAnAbandonedRequestIsAtTheServer).
func TestReconcileWhileAnAbandonedRequestIsAtTheServer(t *testing.T) {
	t.Parallel()
	const window = 1500 * time.Millisecond
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	arrived, unblock := slowFirstCharge(t, srv)
	tr := transportOver(t, journal.NewMemory(), idemretry.WithKeyWindow(window), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	live, giveUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sendErr(tr, post(t, idemretry.WithAction(live, "pay:A"), srv.URL, body)) }()
	<-arrived
	giveUp()
	require.ErrorIs(t, <-done, context.Canceled, "the caller gave up")
	time.Sleep(window + 300*time.Millisecond) // the window ends: the request is still being processed

	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	res, err := tr.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	t.Logf("resume: sent=%v forgotten=%v err=%v; resolved %d", res[0].Sent, res[0].Forgotten, res[0].Err, len(app.resolved))
	payAgain(t, tr, ctx, srv.URL, body, app.repay) // the provider had no charge under the key
	unblock()
	srv.Close() // waits for the abandoned request's charge
	assert.Empty(t, app.resolved, "Resume handed pay:A to Resolve while a request of it was still at the provider")
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once")
}

// listingJournal tells listed each time Unfinished has returned.
type listingJournal struct {
	journal.Journal
	listed chan struct{}
}

// Get passes through to a journal.Getter (Memory is one).
func (j *listingJournal) Get(ctx context.Context, id string) (journal.Record, bool, error) {
	return j.Journal.(journal.Getter).Get(ctx, id)
}

func (j *listingJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Journal.Unfinished(ctx)
	j.listed <- struct{}{}
	return recs, err
}

// twoResumes runs two Resumes of tr at once, the second once the first is
// in app's Resolve and has listed through j, and returns what each did.
func twoResumes(ctx context.Context, tr *idemretry.Transport, app *onceResumer, j *listingJournal) (first, second resumed) {
	r1 := resumeAsync(ctx, tr, app, 1)
	<-j.listed
	<-app.first // the first Resume is in Resolve
	r2 := resumeAsync(ctx, tr, app, 1)
	<-j.listed // the second Resume has listed pay:A too
	close(app.gate)
	return <-r1, <-r2
}

// onceResumer is the app: Resolve asks the provider about rec.Key and, with
// no charge, says forget (the app pays again). The first Resolve waits for
// gate.
type onceResumer struct {
	srv      *payServer
	mu       sync.Mutex
	resolved []journal.Record
	first    chan struct{}
	gate     chan struct{}
}

func (p *onceResumer) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	return nil, errors.New("not used")
}

func (p *onceResumer) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	p.mu.Lock()
	p.resolved = append(p.resolved, rec)
	n := len(p.resolved)
	p.mu.Unlock()
	if n == 1 {
		close(p.first)
		<-p.gate
	}
	charged := p.srv.charged(rec.Key)
	return !charged, nil
}

// Two Resumes run at once in one Transport (at start-up and from a
// periodic job: "safe while the Transport serves other requests"). Both
// list pay:A outcome-unknown. The first resolves it (no charge) and
// forgets it: its result says Forgotten, so the app pays order A again.
// The second, which leads the action's flight after the first (holdFlight),
// reads the record again with stillUnknown, a Reserve that re-creates the
// forgotten record, outcome-unknown under the old key: the action the first
// Resume reported forgotten is back in the journal (a payment of order A
// from another machine is refused meanwhile, and one here waits for the
// second Resolve), and Resolve is asked about the same key a second time,
// and it is forgotten a second time: the app is told twice to pay again.
//
// Found in review 4 of Resume (fefbf4b; was TestReview4TwoResumesResurrectAForgottenAction).
func TestReconcileTwoResumesOfAForgottenAction(t *testing.T) {
	t.Parallel()
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	mem := journal.NewMemory()
	listed := pendingPayA(t, srv, mem, body)
	j := &listingJournal{Journal: mem, listed: make(chan struct{}, 2)}
	tr := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	// A tap after the window: pay:A is recorded outcome-unknown.
	require.ErrorIs(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	app := &onceResumer{srv: srv, first: make(chan struct{}), gate: make(chan struct{})}
	r1, r2 := twoResumes(ctx, tr, app, j)
	forgotten := 0
	for _, o := range []resumed{r1, r2} {
		require.NoError(t, o.err)
		require.Len(t, o.res, 1)
		t.Logf("a Resume: forgotten=%v err=%v", o.res[0].Forgotten, o.res[0].Err)
		if o.res[0].Forgotten {
			forgotten++
		}
	}
	app.mu.Lock()
	keys := []string{}
	for _, r := range app.resolved {
		keys = append(keys, r.Key)
	}
	app.mu.Unlock()
	t.Logf("Resolve asked about keys %v (listed key %s)", keys, listed.Key)
	assert.Len(t, keys, 1, "Resolve was asked about one key twice: the second Resume re-created the record the first had forgotten")
	assert.Equal(t, 1, forgotten, "one action reported forgotten by two Resumes: the app is told twice to pay again")
}

// reentrantResumer's Resolve sends a request of the action it is asked
// about through the same Transport (the app's provider lookup, or its
// "pay again", names the action as its live requests do), bounded by 3 s.
type reentrantResumer struct {
	tr   *idemretry.Transport
	url  string
	body string
	err  error
	took time.Duration
}

func (p *reentrantResumer) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	return nil, errors.New("not used")
}

func (p *reentrantResumer) Resolve(ctx context.Context, rec journal.Record) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(idemretry.WithAction(rctx, rec.ActionID), http.MethodPost, p.url, stringsReader(p.body))
	if err != nil {
		return false, err
	}
	start := time.Now()
	p.err = sendErr(p.tr, req)
	p.took = time.Since(start)
	return false, nil
}

// Resolve sends a request of the same action through the Transport (before
// reconcile it was refused at once: the record is outcome-unknown). Now
// reconcile holds the action's flight while Resolve runs, so the request
// joins Resume's own flight and waits for it: it waits for itself, until
// its context ends (without a deadline: Resume never returns). README
// guarantee 5, "No hopeless waits".
//
// Found in review 4 of Resume (fefbf4b; was TestReview4ResolveThatSendsTheActionWaitsForItself).
func TestReconcileResolveThatSendsTheActionWaitsForItself(t *testing.T) {
	t.Parallel()
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	mem := journal.NewMemory()
	pendingPayA(t, srv, mem, body)
	tr := transportOver(t, mem, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	require.ErrorIs(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	app := &reentrantResumer{tr: tr, url: srv.URL, body: body}
	res, err := tr.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	t.Logf("Resolve's request of pay:A: %v after %v", app.err, app.took)
	// Refused at once, as outcome-unknown, with its key: not left waiting
	// for Resume's own flight until its context ends.
	assert.ErrorIs(t, app.err, idemretry.ErrOutcomeUnknown, "a request of the action sent from Resolve waited for Resume's own flight until its context ended")
	var ae *idemretry.ActionError
	require.ErrorAs(t, app.err, &ae)
	assert.Equal(t, res[0].Record.Key, ae.Key)
}

// journalAheadBy opens a file journal in dir whose persisted time mark is
// ahead of the clock by lead: the device clock ran ahead (a user, a bad
// NTP server) while the journal was written, and was corrected since. It
// returns the journal reopened on the real clock.
func journalAheadBy(t *testing.T, lead time.Duration) *filejournal.Journal {
	t.Helper()
	dir := t.TempDir()
	ahead := func() time.Time { return time.Now().Add(lead) }
	j, err := filejournal.Open(dir, filejournal.WithClock(ahead))
	require.NoError(t, err)
	ctx := context.Background()
	_, _, err = j.Reserve(ctx, journal.Record{ActionID: "warm-up", Key: "00000000-0000-4000-8000-000000000001", CreatedAt: ahead(), State: journal.StatePending}, journal.ReuseAny)
	require.NoError(t, err)
	require.NoError(t, j.Forget(ctx, "warm-up"))
	require.NoError(t, j.Close())
	j, err = filejournal.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() })
	require.Greater(t, time.Until(j.Now()), lead-time.Minute, "the journal's mark is ahead of the clock")
	return j
}

// The settle rule (fefbf4b) is judged by t.now(), which believes a journal
// time mark up to maxClockLead (24 h) ahead of the clock. That choice is
// safe on the sending side ("a mark ahead only ever makes keys look older:
// refused sooner, never sent later"), but for Resolve older is the unsafe
// direction: the settle time passes early. A file journal whose mark is 2 h
// ahead (the clock ran ahead and was corrected, a case clock.go handles on
// purpose): a request of pay:A is sent under a key minted now (aged
// monotonically, so it is sent), reaches the provider, which is slow, and
// its caller gives up. Resume, with the default settle time (1 min) and a
// 1 min key window, finds pay:A's window ended and its settle time passed
// by the mark, though by the clock the key window has not even ended, and
// hands it to Resolve while the request is at the provider: no charge yet,
// the app forgets and pays again, then the first charge is made.
//
// Found in review 5 of Resume (0825e49; was TestReview5SettleJudgedByAJournalMarkAhead).
func TestReconcileSettleJudgedByAJournalMarkAhead(t *testing.T) {
	t.Parallel()
	const body = `{"order":"A"}`
	j := journalAheadBy(t, 2*time.Hour)
	srv := newPayServer(t)
	arrived, unblock := slowFirstCharge(t, srv)
	tr := transportOver(t, j, idemretry.WithKeyWindow(time.Minute), idemretry.WithMaxRetries(0)) // the default settle time
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	live, giveUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sendErr(tr, post(t, idemretry.WithAction(live, "pay:A"), srv.URL, body)) }()
	<-arrived
	giveUp()
	require.ErrorIs(t, <-done, context.Canceled, "the caller gave up")

	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	res, err := tr.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	t.Logf("resume (%v after the key was minted): sent=%v forgotten=%v err=%v; resolved %d",
		time.Since(res[0].Record.CreatedAt).Round(time.Millisecond), res[0].Sent, res[0].Forgotten, res[0].Err, len(app.resolved))
	payAgain(t, tr, ctx, srv.URL, body, app.repay) // the provider had no charge under the key
	unblock()
	srv.Close() // waits for the abandoned request's charge
	assert.Empty(t, app.resolved, "Resume handed pay:A to Resolve within its key window by the clock, while a request of it was at the provider")
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once")
}

// forgetFailsOnce fails the Forget numbered failAt (counting from 1), as a
// journal does whose connection is cut, or a process killed between two
// calls.
type forgetFailsOnce struct {
	journal.Journal
	mu     sync.Mutex
	n      int
	failAt int
}

// Get passes through: the journals the wrappers here stand for (Memory,
// filejournal, sqljournal) are journal.Getters.
func (j *forgetFailsOnce) Get(ctx context.Context, id string) (journal.Record, bool, error) {
	return j.Journal.(journal.Getter).Get(ctx, id)
}

func (j *forgetFailsOnce) Forget(ctx context.Context, id string) error {
	j.mu.Lock()
	j.n++
	fail := j.n == j.failAt
	j.mu.Unlock()
	if fail {
		return errors.New("journal unavailable")
	}
	return j.Journal.Forget(ctx, id)
}

// stillUnknown (fefbf4b) reads a record again with a Reserve that
// re-creates it, outcome-unknown under the listed key, when another Resume
// forgot it meanwhile, and then forgets it again. Between the two the
// action is back in the journal, and if the second call does not happen (a
// journal error, as here; a crash; a cut connection) it stays there: the
// first Resume reported pay:A Forgotten, so the app pays again, and that
// payment is refused (the record is outcome-unknown, its window over); the
// next Resume hands the same key to Resolve a second time, and reports it
// forgotten a second time. The re-creation is what makes the stale
// listing resurrect an action; a read that creates nothing (or a Reserve
// that creates the record as the app's next payment would find it: absent)
// would not.
//
// Found in review 5 of Resume (0825e49; was TestReview5StillUnknownRecreationOutlivesAFailedForget).
func TestReconcileStillUnknownRecreationOutlivesAFailedForget(t *testing.T) {
	t.Parallel()
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	mem := journal.NewMemory()
	listed := pendingPayA(t, srv, mem, body)
	j := &listingJournal{Journal: &forgetFailsOnce{Journal: mem, failAt: 2}, listed: make(chan struct{}, 3)}
	tr := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	require.ErrorIs(t, sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	app := &onceResumer{srv: srv, first: make(chan struct{}), gate: make(chan struct{})}
	o1, o2 := twoResumes(ctx, tr, app, j)
	require.NoError(t, o1.err)
	require.NoError(t, o2.err)
	require.Len(t, o1.res, 1)
	require.Len(t, o2.res, 1)
	t.Logf("first Resume: forgotten=%v err=%v; second: forgotten=%v err=%v", o1.res[0].Forgotten, o1.res[0].Err, o2.res[0].Forgotten, o2.res[0].Err)
	require.True(t, o1.res[0].Forgotten, "the first Resume forgot pay:A")

	// The app pays order A again, as the first Resume's result told it.
	repayErr := sendErr(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	t.Logf("the app's payment of order A again: %v", repayErr)
	go func() { <-j.listed }()
	res3, err := tr.Resume(ctx, app, 1)
	require.NoError(t, err)
	app.mu.Lock()
	keys := []string{}
	for _, r := range app.resolved {
		keys = append(keys, r.Key)
	}
	app.mu.Unlock()
	t.Logf("a later Resume: %d results; Resolve asked about keys %v (listed key %s)", len(res3), keys, listed.Key)
	assert.NoError(t, repayErr, "the payment the app makes after pay:A was reported forgotten is refused: the record is back")
	assert.Len(t, keys, 1, "Resolve was asked about the forgotten key again: stillUnknown's re-created record outlived its Forget")
}

// gatedJournal holds a Resume at two points: after Unfinished has listed
// (until gateList closes), and, once armed, in a Reserve of the listed
// key outcome-unknown (stillUnknown's read, a slow journal call) until
// gateRead closes.
type gatedJournal struct {
	journal.Journal
	key                string
	listed, inRead     chan struct{}
	gateList, gateRead chan struct{}
	armed              sync.Once
	arm                chan struct{}
}

func (j *gatedJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Journal.Unfinished(ctx)
	close(j.listed)
	<-j.gateList
	return recs, err
}

// Get is stillUnknown's read of a journal.Getter: held as the Reserve
// below is, once armed.
func (j *gatedJournal) Get(ctx context.Context, id string) (journal.Record, bool, error) {
	select {
	case <-j.arm:
		j.armed.Do(func() { close(j.inRead) })
		<-j.gateRead
	default:
	}
	return j.Journal.(journal.Getter).Get(ctx, id)
}

func (j *gatedJournal) Reserve(ctx context.Context, want journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	select {
	case <-j.arm:
		if want.Key == j.key && want.State == journal.StateUnknown {
			j.armed.Do(func() { close(j.inRead) })
			<-j.gateRead
		}
	default:
	}
	return j.Journal.Reserve(ctx, want, mode)
}

// The resolving-flight refusal (fefbf4b) is set by holdFlight before
// reconcile has read the record again, so it also refuses requests while
// Resume only checks a stale listing. Here pay:A was listed outcome-unknown
// under K1 by this process's Resume; meanwhile another process sharing the
// journal resolved it (no charge), forgot it, and the app paid order A
// again there, under K2, done. The user taps "pay" for order A here while
// this Resume reads the record (a journal call of a few ms, longer on a
// slow database): the tap should get K2's answer (the journal holds pay:A
// done), but it is refused with ErrOutcomeUnknown and the listed, stale
// key K1: the app shows "payment status unknown" for a paid order.
//
// Found in review 5 of Resume (0825e49; was TestReview5ResolvingRefusalRefusesADoneActionOnAStaleListing).
func TestReconcileResolvingRefusalOnAStaleListing(t *testing.T) {
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	mem := journal.NewMemory()
	listed := pendingPayA(t, srv, mem, body)
	gj := &gatedJournal{Journal: mem, key: listed.Key, listed: make(chan struct{}), inRead: make(chan struct{}),
		gateList: make(chan struct{}), gateRead: make(chan struct{}), arm: make(chan struct{})}
	var openGates sync.Once
	t.Cleanup(func() { openGates.Do(func() { close(gj.gateList); close(gj.gateRead) }) })
	opts := []idemretry.Option{idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0)}
	here := transportOver(t, gj, opts...)
	there := transportOver(t, mem, opts...) // another process sharing the journal
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	require.ErrorIs(t, sendErr(there, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	done := resumeAsync(ctx, here, &providerResumer{srv: srv, url: srv.URL, body: body}, 1)
	<-gj.listed // this Resume listed pay:A unknown under K1

	app := &providerResumer{srv: srv, url: srv.URL, body: body}
	res, err := there.Resume(ctx, app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.True(t, res[0].Forgotten, "the other process resolved and forgot pay:A: %v", res[0].Err)
	require.Equal(t, []string{"pay:A"}, app.repay)
	roundTrip(t, there, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)) // paid again, under K2

	close(gj.arm)
	close(gj.gateList)
	<-gj.inRead // this Resume holds pay:A's flight and reads its record
	tapped := sendAsync(here, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	// The tap waits for the read (a journal call), then, the record being
	// K2's, carries the action on itself.
	require.Eventually(t, func() bool { return strings.Contains(goroutineStacks(), "(*flights).wait") },
		5*time.Second, 5*time.Millisecond, "the tap joins the flight Resume holds")
	close(gj.gateRead)
	tapErr := <-tapped
	openGates.Do(func() {})
	o := <-done
	require.NoError(t, o.err)
	t.Logf("the tap: %v; this Resume: %+v", tapErr, o.res)
	assert.NoError(t, tapErr, "a tap of order A, paid and done under K2, was refused while a Resume checked its stale listing")
}

// forgetGatedJournal holds a Resume after Unfinished has listed (until
// gateList closes) and in its first Forget (until gateForget closes, after
// closing inForget): a slow journal call, or a process paused between two.
type forgetGatedJournal struct {
	journal.Journal
	listed, inForget     chan struct{}
	gateList, gateForget chan struct{}
	once                 sync.Once
}

func (j *forgetGatedJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Journal.Unfinished(ctx)
	close(j.listed)
	<-j.gateList
	return recs, err
}

func (j *forgetGatedJournal) Get(ctx context.Context, id string) (journal.Record, bool, error) {
	return j.Journal.(journal.Getter).Get(ctx, id)
}

func (j *forgetGatedJournal) Forget(ctx context.Context, id string) error {
	first := false
	j.once.Do(func() { first = true })
	if first {
		close(j.inForget)
		<-j.gateForget
	}
	return j.Journal.Forget(ctx, id)
}

// stillUnknown's "forget again" after its Reserve re-created a forgotten
// record was a Forget by action id, not of the record it created: whatever
// the journal held under the id by then was erased. Now the journal (a
// journal.Getter) is read without creating anything, and nothing is
// forgotten. Two processes share the journal. This one's Resume listed pay:A outcome-unknown under K1;
// the other process's Resume resolves it (no charge) and forgets it; this
// Resume's stillUnknown re-creates K1 and, before its Forget, the app
// there pays order A again: refused (the re-created record), so it runs
// Resume again, which resolves K1 (no charge), forgets it, and pays order A
// again under K2, at the provider, slow. Now this Resume's Forget erases
// pay:A: K2's record, with its request in the air. A tap of order A then
// finds nothing and pays under K3: order A is charged twice.
//
// Found in review 5 of Resume (0825e49; was TestReview5StillUnknownForgetErasesAnotherProcesssPayment).
func TestReconcileStillUnknownForgetsOnlyWhatItCreated(t *testing.T) {
	t.Parallel()
	const window = time.Second
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	mem := journal.NewMemory()
	pendingPayA(t, srv, mem, body)
	gj := &forgetGatedJournal{Journal: mem, listed: make(chan struct{}), inForget: make(chan struct{}),
		gateList: make(chan struct{}), gateForget: make(chan struct{})}
	var listOnce, forgetOnce sync.Once
	openList := func() { listOnce.Do(func() { close(gj.gateList) }) }
	openGates := func() { openList(); forgetOnce.Do(func() { close(gj.gateForget) }) }
	t.Cleanup(openGates)
	opts := []idemretry.Option{idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0)}
	here := transportOver(t, gj, opts...)
	there := transportOver(t, mem, opts...) // another process sharing the journal
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(window + 300*time.Millisecond)
	require.ErrorIs(t, sendErr(there, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)

	done := resumeAsync(ctx, here, &providerResumer{srv: srv, url: srv.URL, body: body}, 1)
	<-gj.listed // this Resume listed pay:A unknown under K1

	app1 := &providerResumer{srv: srv, url: srv.URL, body: body}
	res, err := there.Resume(ctx, app1, 1)
	require.NoError(t, err)
	require.True(t, res[0].Forgotten, "there: %v", res[0].Err)
	openList()
	// This Resume reads pay:A again through the journal's Get: gone, so it
	// creates nothing and forgets nothing (a Forget of its would be held
	// here, and erase whatever the other process has made of pay:A since).
	o := <-done
	require.NoError(t, o.err)
	require.Len(t, o.res, 1)
	t.Logf("this Resume: forgotten=%v err=%v", o.res[0].Forgotten, o.res[0].Err)
	require.ErrorIs(t, o.res[0].Err, idemretry.ErrNotResumable)
	select {
	case <-gj.inForget:
		t.Fatal("this Resume forgot pay:A after the other process had reconciled it")
	default:
	}

	// The other process pays order A again, under K2, slow at the provider;
	// a tap here meanwhile joins nothing (another process) and finds K2.
	arrived, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	blocked := false
	srv.mu.Lock()
	srv.script = func(int, http.ResponseWriter, *http.Request) bool {
		srv.mu.Lock()
		first := !blocked
		blocked = true
		srv.mu.Unlock()
		if first {
			close(arrived)
			<-release // the provider is slow with K2
		}
		return false
	}
	srv.mu.Unlock()
	repaid := make(chan error, 1)
	go func() { repaid <- sendErr(there, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)) }()
	<-arrived // K2 pending, its request at the provider
	unblock()
	require.NoError(t, <-repaid)
	tapErr := sendErr(here, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	t.Logf("a tap of order A: %v", tapErr)
	assert.Equal(t, 1, srv.chargeCount(), "order A charged more than once: stillUnknown's Forget erased K2's pending record")
}

// gatedReserveJournal is a Memory whose Reserve of action gated waits for
// open to be closed once armed: a slow disk or database under one live
// request.
type gatedReserveJournal struct {
	*journal.Memory
	gated   string
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // closed when a gated Reserve starts waiting
	open    chan struct{}
}

func (j *gatedReserveJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	j.mu.Lock()
	wait := j.armed && rec.ActionID == j.gated && rec.State == journal.StatePending
	if wait {
		j.armed = false
		close(j.entered)
	}
	j.mu.Unlock()
	if wait {
		select {
		case <-j.open:
		case <-ctx.Done():
			return journal.Record{}, false, ctx.Err()
		}
	}
	return j.Memory.Reserve(ctx, rec, mode)
}

// Resume reconciles an outcome-unknown large named action (keyed
// fingerprint, secret s1) while a live request of the same payload is in
// the air (its own keyed fingerprint, secret s2; its journal call slow).
// holdFlight waits for that flight to land (reconcile.go) and must then go
// on: Resume must return once the live request has landed, not hang until
// its own context ends (README "Resuming after a crash": Resume leads the
// action's flight; guarantee 5: no hopeless waits).
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewResumeReconcileWaitsForKeyedLiveFlightToLand).
func TestReconcileWaitsForAKeyedLiveFlightToLand(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	payload := largePayload("R-1")
	ctx := idemretry.WithAction(context.Background(), "pay:R-1")
	j := &gatedReserveJournal{Memory: journal.NewMemory(), gated: "pay:R-1", entered: make(chan struct{}), open: make(chan struct{})}
	leftPending(t, j, post(t, ctx, srv.URL, payload))
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	// Where new fingerprints are plain (no AES instructions, fips140=only)
	// the live flight is a plain one, and Resume must land after it alike.
	require.Equal(t, idemretry.JournalMakesKeyedFingerprints(j), string(keyedPrefix) == string(recs[0].Fingerprint[:4]),
		"a large named body's fingerprint is keyed where the Transport makes keyed fingerprints")
	rec := recs[0]
	rec.State = journal.StateUnknown // its key window ended, say
	require.NoError(t, j.Update(context.Background(), rec))

	tr := transportOver(t, j, idemretry.WithMaxRetries(0))
	j.mu.Lock()
	j.armed = true
	j.mu.Unlock()
	live := sendAsync(tr, post(t, ctx, srv.URL, payload))
	<-j.entered // the live request leads the action's flight, its Reserve slow

	rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type resumed struct {
		res []idemretry.ResumeResult
		err error
	}
	out := make(chan resumed, 1)
	go func() {
		res, err := tr.Resume(rctx, &appResumer{url: srv.URL}, 0)
		out <- resumed{res, err}
	}()
	time.Sleep(300 * time.Millisecond) // Resume reaches holdFlight (ordering only)
	close(j.open)
	require.ErrorIs(t, <-live, idemretry.ErrOutcomeUnknown, "the live request is refused: the action is outcome-unknown")

	var got resumed
	select {
	case got = <-out:
	case <-time.After(10 * time.Second):
		cancel()
		got = <-out
		t.Errorf("Resume still waiting 10 s after the live flight landed (holdFlight waits on a flight it never joined)")
	}
	require.NoError(t, got.err)
	require.Len(t, got.res, 1)
	assert.False(t, errors.Is(got.res[0].Err, context.DeadlineExceeded) || errors.Is(got.res[0].Err, context.Canceled),
		"Resume's reconcile ended only with its context: %v", got.res[0].Err)
	require.Len(t, srv.seen(), 1, "nothing more was sent")
}

// README: "Resolve reconciles an action whose key window ended (ask the
// provider about rec.Key) and says whether it may be forgotten". An action
// left pending whose window ended while the app was not running is such an
// action, but Resume hands it to Rebuild instead; the rebuilt request is
// refused (ErrKeyWindowExpired, the record turned outcome-unknown), the
// result says Sent, and Resolve is not called: the app must call Resume a
// second time to reconcile it.
//
// Found in the review of Resume (1d85888; was TestReviewResumeResolvesAnExpiredPendingAction).
func TestReconcileAnExpiredPendingAction(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	const window = 300 * time.Millisecond
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`), idemretry.WithKeyWindow(window))
	time.Sleep(2 * window) // the app was not running when the window ended

	second := transportOver(t, j, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0))
	app := &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}
	res, err := second.Resume(context.Background(), app, 0)
	require.NoError(t, err)
	require.Len(t, res, 1)
	t.Logf("result: sent=%v forgotten=%v err=%v; resolved %v; server requests %d", res[0].Sent, res[0].Forgotten, res[0].Err, app.resolved, len(srv.seen()))
	require.Len(t, srv.seen(), 1, "nothing is sent past the window")
	assert.Equal(t, []string{res[0].Record.Key}, app.resolved, "the expired action was not handed to Resolve")
	assert.False(t, res[0].Sent, "reported Sent, though nothing was sent")
}
