package idemretry_test

// Adversarial review of the keyed fingerprint (fingerprint.go, commit
// b358e2b): each test holds a README guarantee over loopback HTTP.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
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

const (
	envKeyedSecretChild = "IDEMRETRY_REVIEW_KEYED_CHILD"
	envKeyedSecretURL   = "IDEMRETRY_REVIEW_KEYED_URL"
)

// keyedSecretChild runs TestKeyedSecretChild in a child process with env
// added, and returns the line it printed after "RoundTrip returned: ".
func keyedSecretChild(t *testing.T, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeyedSecretChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process failed: %s", out)
	for _, line := range strings.Split(string(out), "\n") {
		if s, ok := strings.CutPrefix(line, "RoundTrip returned: "); ok {
			return s
		}
	}
	t.Fatalf("the child printed no result: %s", out)
	return ""
}

// TestKeyedSecretChild is the child process of the test below: it sends
// the large named payment of its parent with crypto/rand.Reader failing.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewKeyedChild).
func TestKeyedSecretChild(t *testing.T) {
	mode := os.Getenv(envKeyedSecretChild)
	if mode == "" {
		t.Skip("the child process of the tests in review_keyed_test.go")
	}
	url := os.Getenv(envKeyedSecretURL)
	j := journal.NewMemory() // its secret drawn before the reader fails
	rand.Reader = failingReader{}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:F-1"), url, largePayload("F-1")))
	if err == nil {
		resp.Body.Close()
		fmt.Println("RoundTrip returned: <nil>", resp.StatusCode)
		return
	}
	var ae *idemretry.ActionError
	fmt.Printf("RoundTrip returned: %v (ActionError %t, MaybeProcessed %t)\n", err, errors.As(err, &ae), ae != nil && ae.MaybeProcessed)
}

// crypto/rand.Reader failing when a large named body draws its
// fingerprint's secret: an error, nothing sent, no crash, prefixed once.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewKeyedSecretFailingRandReader).
func TestKeyedSecretFromAFailingRandReader(t *testing.T) {
	srv := newPayServer(t)
	got := keyedSecretChild(t, envKeyedSecretChild+"=rand", envKeyedSecretURL+"="+srv.URL)
	t.Logf("child: %s", got)
	assert.Equal(t, 1, strings.Count(got, "idemretry: "), "the error carries the prefix once: %s", got)
	assert.NotContains(t, got, "<nil>")
	assert.Empty(t, srv.seen(), "nothing was sent")
}

// A large named payment through a 307 (http.Client follows it): the parent
// has a keyed fingerprint, its hop a plain one (8 of its bytes name it).
// The hop is charged and its answer lost; the app restarts on the file
// journal and pays again: the hop must go out under the key it was
// charged under (guarantee 2), and a second tap while the hop is in the
// air must not charge again.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedRedirectHopKeepsItsKeyAcrossRestart).
func TestRedirectHopOfALargeNamedActionKeepsItsKeyAcrossRestart(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/redir" {
			return false
		}
		w.Header().Set("Location", "/pay")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return true
	}
	srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
	payload := largePayload("RD-1")
	ctx := idemretry.WithAction(context.Background(), "pay:RD-1")
	dir := t.TempDir()
	// No keep-alive: net/http would resend the hop on a reused connection.
	first, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = (&http.Client{Transport: first}).Do(post(t, ctx, srv.URL+"/redir", payload))
	require.Error(t, err, "the hop's answer was lost")
	recs, err := first.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1, "the hop is pending")
	hop := recs[0]
	require.True(t, strings.HasPrefix(hop.ActionID, "pay:RD-1 redirect:"), hop.ActionID)
	require.NotEqual(t, keyedPrefix, hop.Fingerprint[:4], "a hop keeps the plain form")
	require.NoError(t, first.Close())
	require.Equal(t, 1, srv.chargeCount())

	tr := upgraded(t, dir, nil)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := (&http.Client{Transport: tr}).Do(post(t, ctx, srv.URL+"/redir", payload))
			if errs[i] = err; err == nil {
				readAll(t, resp)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "tap %d", i)
	}
	assert.Equal(t, 1, srv.chargeCount(), "charged twice")
	n := 0
	for _, r := range srv.seen()[2:] {
		if r.Key == hop.Key {
			n++
		}
	}
	assert.NotZero(t, n, "the hop went out again under another key")
}

// A large named payment left pending (keyed record, secret s1) in a file
// journal that hashes ids; restarted, the app resumes it while it also
// pays it live (its own secret s2), in either order: the two share one
// flight (guarantee 2: a double tap sends one request), one charge under
// the record's key, both answered.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedResumeAndLiveShareOneFlightHashedIDs).
func TestLargeNamedResumeAndLiveShareOneFlightHashedIDs(t *testing.T) {
	type tc struct {
		first, size string
		hashed      bool
	}
	var cases []tc
	for _, hashed := range []bool{false, true} {
		for _, size := range []string{"large", "small"} {
			for _, first := range []string{"resume", "live"} {
				cases = append(cases, tc{first, size, hashed})
			}
		}
	}
	for _, c := range cases {
		first := c.first
		t.Run(fmt.Sprintf("%s first/%s/hashed=%v", first, c.size, c.hashed), func(t *testing.T) {
			srv := newSlowPayServer(t, 0)
			srv.commitThenDrop = map[int]bool{1: true}
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				if n > 1 {
					time.Sleep(600 * time.Millisecond) // the replay is slow too
				}
				return false
			}
			payload := largePayload("HR-1")
			if c.size == "small" {
				payload = payload[:idemretry.KeyedMinBody-1]
			}
			ctx := idemretry.WithAction(context.Background(), "pay:HR-1")
			dir, fo, old := previousRelease(t, c.hashed)
			require.NoError(t, old.Close())
			before, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir, fo...), idemretry.WithMaxRetries(0))
			require.NoError(t, err)
			_, err = before.RoundTrip(post(t, ctx, srv.URL, payload))
			require.Error(t, err, "the answer was lost")
			require.NoError(t, before.Close())
			<-srv.arrived

			tr := upgraded(t, dir, fo)
			app := &appResumer{url: srv.URL, orders: map[string]string{}}
			recs, err := tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			require.Len(t, recs, 1)
			require.Equal(t, c.size == "large" && idemretry.MakesKeyedFingerprints(tr), string(keyedPrefix) == string(recs[0].Fingerprint[:4]))
			app.orders[recs[0].ActionID] = payload // the app's own record, by the listed (hashed) id

			var res <-chan resumed
			var live <-chan error
			if first == "resume" {
				res = resumeAsync(context.Background(), tr, app, 0)
				<-srv.arrived
				live = sendAsync(tr, post(t, ctx, srv.URL, payload))
			} else {
				live = sendAsync(tr, post(t, ctx, srv.URL, payload))
				<-srv.arrived
				res = resumeAsync(context.Background(), tr, app, 0)
			}
			require.NoError(t, <-live)
			r := <-res
			require.NoError(t, r.err)
			require.Len(t, r.res, 1)
			require.NoError(t, r.res[0].Err)
			srv.requireOnePayment(t, 2)
		})
	}
}

// Guarantee 9 for the keyed form's other inputs: the same large body under
// the same named action, with another URL (path or query) or method, is
// another payload, refused with nothing sent, whether the first request is
// recorded or still in flight (a joiner).
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedActionOtherURLOrMethodIsRefused).
func TestLargeNamedActionOtherURLOrMethodIsRefused(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	payload := largePayload("U-1")
	ctx := idemretry.WithAction(context.Background(), "pay:U-1")
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(0))
	others := func() []*http.Request {
		put := post(t, ctx, srv.URL+"/v1/charges", payload)
		put.Method = http.MethodPatch
		return []*http.Request{
			post(t, ctx, srv.URL+"/v1/charges?amount=2", payload),
			post(t, ctx, srv.URL+"/v1/charge", payload),
			put,
		}
	}
	live := sendAsync(tr, post(t, ctx, srv.URL+"/v1/charges", payload))
	<-srv.arrived
	for i, r := range others() { // in flight: joiners
		require.ErrorIs(t, sendErr(tr, r), idemretry.ErrFingerprintMismatch, "joiner %d", i)
	}
	require.NoError(t, <-live)
	for i, r := range others() { // recorded
		require.ErrorIs(t, sendErr(tr, r), idemretry.ErrFingerprintMismatch, "resend %d", i)
	}
	assert.Len(t, srv.seen(), 1, "another payload was sent")
}

// The leader of a large named payment (its own secret) gives up for its
// own context while a tap of unknown length (plain form, checked in the
// leader's keyed form to join) waits: the tap carries the action on under
// the same key (guarantee 2), one charge, and is answered.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedJoinerCarriesOnAfterTheLeaderGaveUp).
func TestLargeNamedJoinerCarriesOnAfterTheLeaderGaveUp(t *testing.T) {
	srv := newSlowPayServer(t, 0)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			<-release // the leader's attempt hangs until its caller gives up
		}
		return false
	}
	payload := largePayload("A-1")
	ctx := idemretry.WithAction(context.Background(), "pay:A-1")
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(3))
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leader := sendAsync(tr, post(t, lctx, srv.URL, payload))
	<-srv.arrived
	tap := post(t, ctx, srv.URL, payload)
	tap.ContentLength = -1 // its length unknown: a plain fingerprint
	joiner := sendAsync(tr, tap)
	time.Sleep(200 * time.Millisecond) // the tap joins (ordering only)
	cancel()
	require.Error(t, <-leader, "the leader's context ended")
	require.NoError(t, <-joiner, "the tap carried the action on")
	releaseOnce.Do(func() { close(release) })
	reqs := srv.seen()
	require.Len(t, reqs, 2, "the tap sent the action again")
	assert.Equal(t, reqs[0].Key, reqs[1].Key, "under another key")
	assert.Equal(t, 1, srv.chargeCount())
	recs, err := tr.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, recs, "the action is done")
}

// A large named payment charged, its answer lost (pending, keyed record).
// The app sends it again with a GetBody that works for the new request's
// own fingerprint and fails on the next call (the check in the record's
// form: a file removed meanwhile, say). The action exists and may have
// been charged: the error must be an *ActionError naming it with
// MaybeProcessed (README "Errors": MaybeProcessed is false only when no
// attempt, in this run or an earlier one, can have reached the server),
// not a bare error an app takes for "nothing happened".
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedResendGetBodyFailingOnTheCheckIsAnActionError).
func TestLargeNamedResendGetBodyFailingOnTheCheckIsAnActionError(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	payload := largePayload("G-1")
	ctx := idemretry.WithAction(context.Background(), "pay:G-1")
	j := journal.NewMemory()
	leftPending(t, j, post(t, ctx, srv.URL, payload))
	tr := transportOver(t, j, idemretry.WithMaxRetries(0))
	if !idemretry.MakesKeyedFingerprints(tr) {
		// The record is plain, as is the resend's fingerprint: they are
		// compared as they are, and GetBody is never called a second time.
		t.Skip("this process makes no keyed fingerprints (no AES instructions, or fips140=only): no check in the record's form")
	}

	req, gone := secondGetBodyFails(post(t, ctx, srv.URL, payload))
	requireCheckFailed(t, sendErr(tr, req), gone, "pay:G-1")
	assert.Len(t, srv.seen(), 1, "nothing more was sent")
}

// secondGetBodyFails makes req's GetBody fail from its second call on,
// with the error it returns: an upload whose file is gone once the first
// copy was read.
func secondGetBodyFails(req *http.Request) (*http.Request, error) {
	gone := errors.New("the upload's file was removed")
	calls := 0
	getBody := req.GetBody
	req.GetBody = func() (io.ReadCloser, error) {
		if calls++; calls > 1 {
			return nil, gone
		}
		return getBody()
	}
	return req, gone
}

// requireCheckFailed requires err to be the failed check of a request
// against its action's keyed fingerprint: an *ActionError for action, with
// MaybeProcessed, wrapping cause, prefixed once.
func requireCheckFailed(t *testing.T, err, cause error, action string) {
	t.Helper()
	require.ErrorIs(t, err, cause)
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), "prefixed once: %v", err)
	var ae *idemretry.ActionError
	require.True(t, errors.As(err, &ae), "a bare error for an action that exists or is in flight: %v", err)
	assert.True(t, ae.MaybeProcessed)
	assert.Equal(t, action, ae.Action)
}

// The same for a tap of a large named payment in flight: its check in the
// leader's form fails (GetBody, on its second call); the action is in the
// air, so the error is an *ActionError with MaybeProcessed.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedTapGetBodyFailingOnTheCheckIsAnActionError).
func TestLargeNamedTapGetBodyFailingOnTheCheckIsAnActionError(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	payload := largePayload("G-2")
	ctx := idemretry.WithAction(context.Background(), "pay:G-2")
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(0))
	if !idemretry.MakesKeyedFingerprints(tr) {
		t.Skip("this process makes no keyed fingerprints (no AES instructions, or fips140=only): the tap is compared with the leader's plain fingerprint as it is")
	}
	leader := sendAsync(tr, post(t, ctx, srv.URL, payload))
	<-srv.arrived
	req, gone := secondGetBodyFails(post(t, ctx, srv.URL, payload))
	err := sendErr(tr, req)
	require.NoError(t, <-leader)
	requireCheckFailed(t, err, gone, "pay:G-2")
	assert.Len(t, srv.seen(), 1, "the tap sent a request")
}
