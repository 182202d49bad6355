package idemretry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

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
	p.srv.mu.Lock()
	_, charged := p.srv.stored[rec.Key]
	p.srv.mu.Unlock()
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

// panickingResumer's Resolve panics, as app code may (a nil map, a bug).
type panickingResumer struct{}

func (panickingResumer) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	return nil, errors.New("not used")
}

func (panickingResumer) Resolve(context.Context, journal.Record) (bool, error) {
	panic("the app's Resolve has a bug")
}

// A panic in the app's Resolve (or Rebuild) happens on a goroutine Resume
// started, so the caller of Resume cannot recover it: the whole process
// dies, every other request in flight with it. (RoundTrip's lead lands its
// flight on a panic "so that its joiners and later requests are not
// stranded"; reconcile's deferred landing does the same, for nothing.) A
// callback panic should reach Resume's caller, on its own goroutine (as
// errgroup re-panics in Wait), or become the action's error.
//
// Found in review 4 of Resume (fefbf4b; was TestReview4ResolvePanicIsTheCallersToRecover).
func TestResumeResolvePanicIsTheCallersToRecover(t *testing.T) {
	if os.Getenv("IDEMRETRY_REVIEW4_PANIC_CHILD") == "1" {
		const body = `{"order":"A"}`
		srv := newPayServer(t)
		mem := journal.NewMemory()
		pendingPayA(t, srv, mem, body)
		tr := transportOver(t, mem, idemretry.WithKeyWindow(500*time.Millisecond), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0))
		time.Sleep(800 * time.Millisecond)
		require.ErrorIs(t, sendErr(tr, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, body)), idemretry.ErrKeyWindowExpired)
		func() {
			defer func() { fmt.Println("recovered:", recover()) }()
			_, _ = tr.Resume(context.Background(), panickingResumer{}, 1)
		}()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestResumeResolvePanicIsTheCallersToRecover$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMRETRY_REVIEW4_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	first := strings.SplitN(string(out), "\n", 2)[0]
	require.NoError(t, err, "the process died of the app's panic in Resolve, which Resume's caller recovers: %s", first)
	assert.Contains(t, string(out), "recovered: the app's Resolve has a bug")
}
