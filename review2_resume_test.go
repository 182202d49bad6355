package idemretry_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

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
	p.srv.mu.Lock()
	_, charged := p.srv.stored[rec.Key]
	p.srv.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resolved = append(p.resolved, rec)
	if !charged {
		p.repay = append(p.repay, rec.ActionID)
	}
	return true, nil
}

func stringsReader(s string) io.Reader { return &onlyReaderString{s: s} }

// onlyReaderString is a strings.Reader without its other methods, so the
// request is buffered by the Transport like any streamed body.
type onlyReaderString struct{ s string }

func (o *onlyReaderString) Read(p []byte) (int, error) {
	if o.s == "" {
		return 0, io.EOF
	}
	n := copy(p, o.s)
	o.s = o.s[n:]
	return n, nil
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
	for time.Now().Before(deadline) && !strings.Contains(goroutineStacks(), "(*flight).wait") {
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

// pausingJournal is a journal.Memory whose Reserve can be held: before
// (if set) runs before the inner Reserve of want, after (if set) once it
// returned. Each hook is taken (cleared) as it runs. It stands for a
// journal shared by two processes (sqljournal), whose calls interleave.
type pausingJournal struct {
	journal.Journal
	mu            sync.Mutex
	before, after func(want, got journal.Record, created bool)
}

func (p *pausingJournal) Reserve(ctx context.Context, want journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	p.mu.Lock()
	before := p.before
	if before != nil && want.ActionID == "pay:A" {
		p.before = nil
	} else {
		before = nil
	}
	p.mu.Unlock()
	if before != nil {
		before(want, journal.Record{}, false)
	}
	got, created, err := p.Journal.Reserve(ctx, want, mode)
	p.mu.Lock()
	after := p.after
	if after != nil && want.ActionID == "pay:A" {
		p.after = nil
	} else {
		after = nil
	}
	p.mu.Unlock()
	if after != nil && err == nil {
		after(want, got, created)
	}
	return got, created, err
}

// pendingPayA leaves pay:A pending in j under a key the server never
// processed (the connection was cut before it was), and returns its
// record; srv answers normally after.
func pendingPayA(t *testing.T, srv *payServer, j journal.Journal, body string) journal.Record {
	t.Helper()
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			hijackAndClose(w) // lost before it was processed
			return true
		}
		return false
	}
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, body))
	srv.mu.Lock()
	srv.script = nil
	srv.mu.Unlock()
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	return recs[0]
}

// Two machines share one journal (sqljournal; here a journal.Memory both
// Transports use). Machine A resumes pay:A; meanwhile machine B reconciled
// it (the provider had no charge under its key) and forgot it, and its user
// pays order A again. A's Resume finds no record: its Reserve re-creates
// the listed record, which B's request, reserved just after, finds. It
// must be neither sent under the listed key (first found pending, it was:
// a payment B had reconciled) nor erased under B (then forgotten again, it
// was: B's next tap was charged a second time): it is recorded
// outcome-unknown, and B is refused until it is reconciled.
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeNotResumableForgetErasesAnotherMachinesAction).
func TestResumeNotResumableForgetsOnlyItsOwnAction(t *testing.T) {
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	j := &pausingJournal{Journal: journal.NewMemory()}
	listed := pendingPayA(t, srv, j, body)
	trA := transportOver(t, j)
	trB := transportOver(t, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var errB error
	seenBefore := len(srv.seen())
	j.mu.Lock()
	j.after = func(_, got journal.Record, created bool) {
		// Resume's Reserve has just re-created the listed record: machine
		// B's user pays order A now.
		if !created || got.Key != listed.Key {
			return
		}
		errB = sendErr(trB, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	}
	j.mu.Unlock()
	g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
	done := resumeAsync(ctx, trA, g, 1)
	<-g.rebuilding
	require.NoError(t, j.Forget(ctx, "pay:A")) // machine B reconciled pay:A: not charged, forgotten
	close(g.gate)
	res := (<-done).res
	require.Len(t, res, 1)
	t.Logf("A's resume: err=%v; B's request: %v", res[0].Err, errB)
	require.ErrorIs(t, res[0].Err, idemretry.ErrNotResumable)
	// Resume recorded the forgotten action again as outcome-unknown: B's
	// payment is refused (nothing sent) until it is reconciled, rather
	// than sent under the listed key, or the record erased under B.
	require.ErrorIs(t, errB, idemretry.ErrOutcomeUnknown)
	require.ErrorIs(t, sendErr(trB, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body)), idemretry.ErrOutcomeUnknown)
	assert.Equal(t, seenBefore, len(srv.seen()), "a request was sent for an action the app had forgotten")
	assert.Zero(t, srv.chargeCount())
}

// The app forgot pay:A (it reconciled it) while Resume was rebuilding it,
// and then pays order A again. Its request arrives while Resume's request
// of pay:A leads the action's flight (its Reserve is slow: a shared
// database): it joins. It must not be given Resume's own refusal,
// ErrNotResumable (README: "from Resume"): it carries the action on, and
// finds what Resume left, the action recorded outcome-unknown.
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeLiveJoinerIsNotGivenResumesRefusal).
func TestResumeLiveJoinerIsNotGivenResumesRefusal(t *testing.T) {
	const body = `{"order":"A"}`
	srv := newPayServer(t)
	j := &pausingJournal{Journal: journal.NewMemory()}
	pendingPayA(t, srv, j, body)
	tr := transportOver(t, j)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	reserving, slow := make(chan struct{}), make(chan struct{})
	j.mu.Lock()
	j.before = func(journal.Record, journal.Record, bool) { close(reserving); <-slow }
	j.mu.Unlock()
	g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
	done := resumeAsync(ctx, tr, g, 1)
	<-g.rebuilding
	require.NoError(t, j.Forget(ctx, "pay:A")) // the app reconciled pay:A and forgot it
	close(g.gate)
	<-reserving // Resume's request leads pay:A's flight, in its Reserve
	live := sendAsync(tr, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, body))
	time.Sleep(500 * time.Millisecond) // the app's request joins the flight
	close(slow)
	res := (<-done).res
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, idemretry.ErrNotResumable)
	err := <-live
	t.Logf("the app's own request of pay:A: %v", err)
	assert.NotErrorIs(t, err, idemretry.ErrNotResumable, "a live request was refused with Resume's ErrNotResumable")
	// It led the action after Resume's refusal and found it recorded
	// outcome-unknown (Resume re-created the forgotten action so): refused,
	// nothing sent, until it is reconciled.
	assert.ErrorIs(t, err, idemretry.ErrOutcomeUnknown)
	assert.Equal(t, 1, len(srv.seen()), "a request was sent for an action forgotten during Resume")
}

// forgettingResumer is an app that, asked to rebuild pay:A, finds it has
// reconciled the order by itself meanwhile (cancelled it, say) and forgets
// the action, then returns its request as Rebuild must.
type forgettingResumer struct {
	j    journal.Journal
	url  string
	body string
}

func (f *forgettingResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	if err := f.j.Forget(ctx, rec.ActionID); err != nil {
		return nil, err
	}
	return http.NewRequestWithContext(ctx, http.MethodPost, f.url, stringsReader(f.body))
}

func (*forgettingResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// The app forgot pay:A (it reconciled it itself) while Resume rebuilt it.
// Resume's Reserve finds no record and re-creates the listed one, durably
// (synced, with its old key and CreatedAt). A process killed right after
// (SIGKILL, the battery, the OS reclaiming an app at start-up) must not
// leave it pending: the next start would list it and Resume send the
// forgotten key (the order the app cancelled, charged). Outcome-unknown, it
// goes to Resolve. Here the child is held at that moment by a journal that
// pauses after the Reserve (the window is otherwise a sync long) and
// killed for real.
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeCrashAfterReCreateResurrectsAForgottenAction).
func TestResumeKilledAfterReCreateLeavesTheForgottenActionUnknown(t *testing.T) {
	const body = `{"order":"A"}`
	if dir := os.Getenv("IDEMRETRY_REVIEW2_RECREATE_DIR"); dir != "" {
		resumeThenHang(t, dir, os.Getenv("IDEMRETRY_REVIEW2_RECREATE_URL"), body)
		return
	}
	srv := newPayServer(t)
	dir := t.TempDir()
	fj, err := filejournal.Open(dir)
	require.NoError(t, err)
	listed := pendingPayA(t, srv, fj, body)
	require.NoError(t, fj.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestResumeKilledAfterReCreateLeavesTheForgottenActionUnknown$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "IDEMRETRY_REVIEW2_RECREATE_DIR="+dir, "IDEMRETRY_REVIEW2_RECREATE_URL="+srv.URL)
	require.NoError(t, cmd.Start())
	marker := filepath.Join(dir, "..", filepath.Base(dir)+".recreated")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("the child never re-created the record")
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	after, err := filejournal.Open(dir)
	require.NoError(t, err)
	defer after.Close()
	recs, err := after.Unfinished(context.Background())
	require.NoError(t, err)
	for _, r := range recs {
		t.Logf("after the crash the journal lists %s %s key %s (listed before: key %s)", r.ActionID, r.State, r.Key, listed.Key)
		assert.NotEqual(t, journal.StatePending, r.State, "an action the app forgot is pending again after a crash, under its old key: the next Resume sends it")
	}
}

// resumeThenHang is the child: it resumes pay:A, whose Rebuild forgets it,
// and hangs once Resume's Reserve has re-created the record.
func resumeThenHang(t *testing.T, dir, url, body string) {
	fj, err := filejournal.Open(dir)
	require.NoError(t, err)
	j := &pausingJournal{Journal: fj}
	j.after = func(_, _ journal.Record, created bool) {
		if created {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "..", filepath.Base(dir)+".recreated"), nil, 0o600))
			select {} // killed here
		}
	}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j))
	require.NoError(t, err)
	_, _ = tr.Resume(context.Background(), &forgettingResumer{j: j, url: url, body: body}, 0)
	t.Fatal("Resume returned: no record was re-created")
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
