package idemretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// gatedResumer rebuilds one body for every record, on Resume's ctx; before
// returning the request it says so on rebuilding (if set) and waits for
// gate (if set): an app whose Rebuild reads its own records, slowly.
type gatedResumer struct {
	url, method, body string
	rebuilding        chan journal.Record
	gate              chan struct{}
	rebuilt           atomic.Int32
}

func (g *gatedResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	g.rebuilt.Add(1)
	if g.rebuilding != nil {
		g.rebuilding <- rec
	}
	if g.gate != nil {
		<-g.gate
	}
	method := g.method
	if method == "" {
		method = http.MethodPost
	}
	return http.NewRequestWithContext(ctx, method, g.url, strings.NewReader(g.body))
}

func (g *gatedResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// An unnamed payment is pending in the journal (its answer lost after the
// server charged it, or simply still in flight when Resume lists the
// journal). While Resume rebuilds it, the app's own identical request
// finishes the action under its key (the server replays, or charges it
// once). Resume then sends the rebuilt request: the record it was given is
// done by now, and the fingerprint-named reserve (journal.ReusePending)
// replaces a done record with a NEW key, so Resume makes a second payment.
// resumedIdentity says a resumed request is "exactly rec's action ... never
// a new one", and the README says Resume sends a pending action "under its
// stored key".
//
// Found in the review of Resume (1d85888; was TestReviewResumeNeverMintsANewKey).
func TestResumeNeverMintsANewKey(t *testing.T) {
	const body = `{"order":"U","amount":100}`
	for _, tc := range []struct {
		name string
		// pending leaves the unnamed payment pending in j (and returns a
		// func that finishes it with the app's own request), using srv.
		setup func(t *testing.T, srv *payServer, j journal.Journal, tr *idemretry.Transport) (finish func())
		opts  []idemretry.Option
	}{
		{"left by a crash, then the user taps again", func(t *testing.T, srv *payServer, j journal.Journal, tr *idemretry.Transport) func() {
			srv.commitThenDrop = map[int]bool{1: true} // charged, the answer lost
			leftPending(t, j, post(t, context.Background(), srv.URL, body))
			return func() {
				resp := roundTrip(t, tr, post(t, context.Background(), srv.URL, body)) // the same payment, resent by the app
				require.True(t, idemretry.IsReplay(resp), "the app's resend reused the pending key")
			}
		}, nil},
		{"left by a crash, then the user taps again, WithDuplicateWindow", func(t *testing.T, srv *payServer, j journal.Journal, tr *idemretry.Transport) func() {
			srv.commitThenDrop = map[int]bool{1: true}
			leftPending(t, j, post(t, context.Background(), srv.URL, body))
			time.Sleep(300 * time.Millisecond) // the restart comes after the duplicate window
			return func() {
				resp := roundTrip(t, tr, post(t, context.Background(), srv.URL, body))
				require.True(t, idemretry.IsReplay(resp), "the app's resend reused the pending key")
			}
		}, []idemretry.Option{idemretry.WithDuplicateWindow(200 * time.Millisecond)}},
		{"in flight when Resume lists it (no crash at all)", func(t *testing.T, srv *payServer, _ journal.Journal, tr *idemretry.Transport) func() {
			srv.delay, srv.arrived = 300*time.Millisecond, make(chan int, 10)
			live := make(chan *http.Response, 1)
			go func() {
				resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, body))
				if err != nil {
					live <- nil
					return
				}
				live <- resp
			}()
			<-srv.arrived // reserved (pending) and sent
			return func() {
				resp := <-live
				require.NotNil(t, resp)
				readAll(t, resp)
			}
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			j := journal.NewMemory()
			tr := transportOver(t, j, tc.opts...)
			finish := tc.setup(t, srv, j, tr)

			g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := resumeAsync(ctx, tr, g, 1)
			rec := <-g.rebuilding // Resume listed the pending payment and is rebuilding it
			require.Equal(t, journal.StatePending, rec.State)
			finish() // the app's own request finishes the action under rec.Key
			close(g.gate)
			res := (<-done).res
			require.Len(t, res, 1)

			reqs := srv.seen()
			t.Logf("result: sent=%v status=%d err=%v; keys on the wire %v; charges %d", res[0].Sent, res[0].Status, res[0].Err, keysOf(reqs), srv.chargeCount())
			for i, r := range reqs {
				assert.Equal(t, rec.Key, r.Key, "request %d: Resume sent the action under a key other than its stored one", i+1)
			}
			require.Equal(t, 1, srv.chargeCount(), "the payment the user made once was charged twice")
		})
	}
}

// README, "Resuming after a crash": the final answer's body "is discarded
// as any is, at most 64 KiB for at most 200 ms, so a body that never ends
// cannot hold Resume up". Once a live request of the same action joins the
// flight Resume leads (one flight per action: the app re-sends the payment
// at start-up while Resume runs), the flight reads the whole body into
// memory for the joiner (flight.share: io.ReadAll up to 1 MiB), with no
// time bound: a body that stalls holds Resume, under a context without a
// deadline, forever.
//
// Found in the review of Resume (1d85888; was TestReviewResumeStalledBodyWithJoiner).
func TestResumeStalledBodyWithJoiner(t *testing.T) {
	var n atomic.Int32
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			hijackAndClose(w) // the first answer is lost: the action stays pending
		case 2:
			close(arrived)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			stallBody(w, r, http.StatusCreated, `{"id":`, nil)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	j := journal.NewMemory()
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))

	second := transportOver(t, j)
	r := &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}
	ctx, cancel := context.WithCancel(context.Background()) // no deadline; cancelled only to free the test
	defer cancel()
	done := resumeAsync(ctx, second, r, 1)
	<-arrived // Resume's request is at the server: Resume leads the flight

	liveCtx, liveCancel := context.WithCancel(context.Background())
	defer liveCancel()
	liveDone := make(chan struct{})
	go func() {
		defer close(liveDone)
		_ = sendErr(second, post(t, idemretry.WithAction(liveCtx, "pay:A"), srv.URL, `{"order":"A"}`))
	}()
	require.Eventually(t, func() bool { return strings.Contains(goroutineStacks(), "(*flight).wait") },
		5*time.Second, 5*time.Millisecond, "the live request joins Resume's flight")
	close(release) // the 201's headers and a first chunk, then the body stalls

	select {
	case r := <-done:
		res := r.res
		require.Len(t, res, 1)
		assert.Equal(t, http.StatusCreated, res[0].Status)
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		<-liveDone
		t.Fatalf("Resume did not return within 10 s of a final answer whose body stalls, once a live request joined its flight")
	}
	liveCancel()
	<-liveDone
	second.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// README: Rebuild returns "the same method, URL and body ... the
// fingerprint is checked". A rebuilt request whose method is not keyed (an
// app that rebuilt a PUT, or left Method empty, which means GET) skips the
// action entirely: it is sent without the key, unchecked, retried as an
// idempotent method, and reported Sent with the server's status, while the
// payment stays pending under its key.
//
// Found in the review of Resume (1d85888; was TestReviewResumeChecksTheMethod).
func TestResumeChecksTheMethod(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))

	second := transportOver(t, j)
	g := &gatedResumer{url: srv.URL, method: http.MethodPut, body: `{"order":"A"}`}
	res, err := second.Resume(context.Background(), g, 0)
	require.NoError(t, err)
	require.Len(t, res, 1)
	reqs := srv.seen()
	t.Logf("result: sent=%v status=%d err=%v; after the restart the server saw %d request(s), methods/keys %v/%q",
		res[0].Sent, res[0].Status, res[0].Err, len(reqs)-1, reqs[len(reqs)-1].Method, reqs[len(reqs)-1].Key)
	assert.ErrorIs(t, res[0].Err, idemretry.ErrFingerprintMismatch)
	require.Len(t, reqs, 1, "a rebuilt request with another method was sent, without its key")
}

// ResumeResult.Sent: "the action was pending and its rebuilt request was
// sent with its key". It is set for any request handed to RoundTrip, even
// one refused before anything was written (here, a rebuilt body that is not
// the action's: ErrFingerprintMismatch), so an app cannot tell "sent, no
// answer" from "never sent".
//
// Found in the review of Resume (1d85888; was TestReviewResumeSentMeansSent).
func TestResumeSentMeansSent(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))

	second := transportOver(t, j)
	g := &gatedResumer{url: srv.URL, body: `{"order":"A","amount":999}`} // not the action's body
	res, err := second.Resume(context.Background(), g, 0)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, idemretry.ErrFingerprintMismatch)
	require.Len(t, srv.seen(), 1, "nothing was sent after the restart")
	t.Logf("Stats.Resumed=%d", second.Stats().Resumed)
	assert.False(t, res[0].Sent, "ResumeResult.Sent is true for a request refused before anything was sent")
	assert.Zero(t, second.Stats().Resumed, "Stats.Resumed counts an action nothing was sent for")
}

// Resume called with a ctx that has already ended (or whose ctx ends
// while it is still handing out actions) should start nothing: "Resume
// returns a result per action, and an error only if ... ctx ended". Its
// loop picks at random between a free slot and ctx.Done (a select with
// both ready), so it goes on handing actions to Rebuild (and Resolve, which
// may forget them) with an ended ctx, about half the time each. The
// journal here (journal.Memory) lists without looking at ctx.
//
// Found in the review of Resume (1d85888; was TestReviewResumeStartsNothingOnceCtxEnded).
func TestResumeStartsNothingOnceCtxEnded(t *testing.T) {
	j := journal.NewMemory()
	for i := range 8 {
		_, _, err := j.Reserve(context.Background(), journal.Record{ActionID: fmt.Sprintf("pay:%d", i), Key: fmt.Sprintf("k-%d", i),
			CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
		require.NoError(t, err)
	}
	tr := transportOver(t, j)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	started := 0
	for range 20 {
		g := &gatedResumer{} // counts Rebuild calls; builds nothing that can be sent (no URL)
		res, err := tr.Resume(ctx, nilRebuild{g}, 0)
		require.ErrorIs(t, err, context.Canceled)
		started += int(g.rebuilt.Load())
		_ = res
	}
	t.Logf("over 20 Resume calls with an ended ctx, Rebuild was called %d time(s)", started)
	require.Zero(t, started, "Resume handed actions to Rebuild after its ctx had ended")
}

// nilRebuild counts Rebuild calls in g and rebuilds nothing (the action is
// left pending).
type nilRebuild struct{ g *gatedResumer }

func (n nilRebuild) Rebuild(context.Context, journal.Record) (*http.Request, error) {
	n.g.rebuilt.Add(1)
	return nil, nil
}
func (nilRebuild) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

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

// A base RoundTripper that hands back a response with a nil Body (a
// logging or caching middleware that consumed it; http.Client itself
// accepts one, turning it into http.NoBody): RoundTrip passes it through,
// every discard path checks for it, but Resume's drain of the final answer
// reads and closes resp.Body unchecked, and its goroutine's nil-pointer
// panic ends the app at start-up. "Bad input ... never a panic." Run in a
// child process, since the panic is on a goroutine of Resume's and cannot
// be recovered by the test.
//
// Found in the review of Resume (1d85888; was TestReviewResumeNilBodyDoesNotPanic).
func TestResumeNilBodyDoesNotPanic(t *testing.T) {
	if os.Getenv("IDEMRETRY_REVIEW_NILBODY") == "1" {
		resumeOverNilBodyBase(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestResumeNilBodyDoesNotPanic$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMRETRY_REVIEW_NILBODY=1")
	out, err := cmd.CombinedOutput()
	first := string(out)
	if i := strings.Index(first, "\n\ngoroutine "); i > 0 {
		first = first[:i]
	}
	t.Logf("child: %v\n%s", err, first)
	require.NoError(t, err, "Resume panicked on a final answer with a nil Body")
}

func resumeOverNilBodyBase(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))

	inner := &http.Transport{}
	defer inner.CloseIdleConnections()
	consuming := rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := inner.RoundTrip(r)
		if err == nil {
			io.Copy(io.Discard, resp.Body) // logged it, and forgot to put it back
			resp.Body.Close()
			resp.Body = nil
		}
		return resp, err
	})
	second, err := idemretry.NewTransport(consuming, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer second.Close()
	res, err := second.Resume(context.Background(), &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}, 0)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, http.StatusCreated, res[0].Status)
}

// The action Resume listed is no longer in the journal under its key when
// Resume comes to send it: the app forgot it (it reconciled it by itself),
// or it finished and the user then made the same unnamed payment again (a
// new action, under a new key, in flight). Resume sends nothing, under
// either key, and says so with ErrNotResumable; a forgotten one is not
// brought back (the journal is a journal.Getter: nothing is created to
// find out).
func TestResumeSendsNothingForAnActionNoLongerListed(t *testing.T) {
	const body = `{"order":"U","amount":100}`
	for _, tc := range []struct {
		name string
		// meanwhile runs while Resume rebuilds the listed action.
		meanwhile func(t *testing.T, srv *payServer, j journal.Journal, tr *idemretry.Transport, rec journal.Record)
		left      int // records left in the journal after Resume
	}{
		{"forgotten", func(t *testing.T, _ *payServer, j journal.Journal, _ *idemretry.Transport, rec journal.Record) {
			require.NoError(t, j.Forget(context.Background(), rec.ActionID))
		}, 0},
		{"finished, then paid again", func(t *testing.T, srv *payServer, _ journal.Journal, tr *idemretry.Transport, _ journal.Record) {
			roundTrip(t, tr, post(t, context.Background(), srv.URL, body)) // finishes the listed action (a replay)
			srv.delay, srv.arrived = 500*time.Millisecond, make(chan int, 10)
			go func() { _ = sendErr(tr, post(t, context.Background(), srv.URL, body)) }() // the user pays again
			<-srv.arrived
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.commitThenDrop = map[int]bool{1: true}
			j := journal.NewMemory()
			leftPending(t, j, post(t, context.Background(), srv.URL, body))
			tr := transportOver(t, j)

			g := &gatedResumer{url: srv.URL, body: body, rebuilding: make(chan journal.Record, 1), gate: make(chan struct{})}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := resumeAsync(ctx, tr, g, 1)
			rec := <-g.rebuilding
			tc.meanwhile(t, srv, j, tr, rec)
			before := len(srv.seen())
			close(g.gate)
			res := (<-done).res
			require.Len(t, res, 1)
			t.Logf("result: sent=%v status=%d err=%v", res[0].Sent, res[0].Status, res[0].Err)
			require.ErrorIs(t, res[0].Err, idemretry.ErrNotResumable)
			var ae *idemretry.ActionError
			require.ErrorAs(t, res[0].Err, &ae)
			assert.Equal(t, rec.Key, ae.Key)
			assert.False(t, res[0].Sent)
			assert.Equal(t, before, len(srv.seen()), "Resume sent a request for an action no longer listed")
			if tc.name == "forgotten" {
				left, err := j.Unfinished(context.Background())
				require.NoError(t, err)
				assert.Empty(t, left, "Resume brought back an action that was forgotten")
			}
		})
	}
}
