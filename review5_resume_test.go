package idemretry_test

import (
	"context"
	"errors"
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
	require.Eventually(t, func() bool { return strings.Contains(goroutineStacks(), "(*flight).wait") },
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
