package idemretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// A process that died with payments whose answers were lost restarts and
// resumes: each pending action is sent again under its own key (the server
// replays, charging nothing more), each unknown one is resolved and
// forgotten.
func TestResumeAfterRestart(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true, 2: true, 3: true} // charged, answers lost
	j := journal.NewMemory()
	first, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = first.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))
	require.Error(t, err)
	req := post(t, context.Background(), srv.URL, `{"order":"K"}`)
	req.Header.Set("Idempotency-Key", "order-K-key")
	_, err = first.RoundTrip(req)
	require.Error(t, err)
	_, err = first.RoundTrip(post(t, context.Background(), srv.URL, `{"order":"U"}`))
	require.Error(t, err)
	require.NoError(t, first.Close()) // the "crash": the Transport is gone, the journal stays
	lost := journal.Record{ActionID: "pay:old", Key: "k-old", CreatedAt: time.Now().Add(-30 * time.Hour), State: journal.StatePending}
	_, _, err = j.Reserve(context.Background(), lost, journal.ReuseAny)
	require.NoError(t, err)
	lost.State = journal.StateUnknown
	require.NoError(t, j.Update(context.Background(), lost))
	require.Equal(t, 3, srv.chargeCount())

	second, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer second.Close()
	app := &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`, "key:order-K-key": `{"order":"K"}`},
		unnamed: []string{`{"order":"U"}`}}
	results, err := second.Resume(context.Background(), app, 2)
	require.NoError(t, err)
	require.Len(t, results, 4)
	sent, forgotten := 0, 0
	for _, r := range results {
		assert.NoError(t, r.Err, r.Record.ActionID)
		if r.Sent {
			sent++
			assert.Equal(t, 201, r.Status, r.Record.ActionID)
		}
		if r.Forgotten {
			forgotten++
		}
	}
	assert.Equal(t, 3, sent)
	assert.Equal(t, 1, forgotten)
	assert.Equal(t, []string{"k-old"}, app.resolved)
	assert.Equal(t, 3, srv.chargeCount(), "a resumed payment was charged again")
	reqs := srv.seen()
	require.Len(t, reqs, 6)
	assert.ElementsMatch(t, keysOf(reqs[:3]), keysOf(reqs[3:]), "each resent under its own key")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un)
	assert.Equal(t, int64(3), second.Stats().Resumed)
}

// Resume of a fingerprint-named action whose Rebuild returns another
// body: the README says the fingerprint is checked; instead a new action is
// minted and sent (a second payment).
func TestResumeRefusesAnotherPayload(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	first, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = first.RoundTrip(post(t, context.Background(), srv.URL, `{"order":"U","amount":100}`))
	require.Error(t, err)
	require.NoError(t, first.Close())
	recs, _ := j.Unfinished(context.Background())
	require.Len(t, recs, 1)

	second, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer second.Close()
	app := &appResumer{url: srv.URL, orders: map[string]string{}, unnamed: []string{`{"order":"U","amount":999}`}}
	res, err := second.Resume(context.Background(), app, 0)
	require.NoError(t, err)
	t.Logf("result: sent=%v status=%d err=%v; server requests=%d charges=%d keys=%v", res[0].Sent, res[0].Status, res[0].Err, len(srv.seen()), srv.chargeCount(), keysOf(srv.seen()))
	require.Len(t, srv.seen(), 1, "a rebuilt request with another body was sent")
}

// on a journal that hashes ids, a resumed fingerprint-named action is
// named WithAction("sha256:..."), so it is no longer "by fingerprint": its
// done is not synced (Stats.Syncs), unlike on a plain journal.
func TestResumeHashedFingerprintDoneSynced(t *testing.T) {
	t.Parallel()
	resumeInEachIDMode(t, func(t *testing.T, srv *payServer, _ string, _ []filejournal.Option, second *idemretry.Transport) {
		res, err := second.Resume(context.Background(), resumerOfU(t, second, srv), 0)
		require.NoError(t, err)
		t.Logf("status=%d err=%v keys=%v syncs=%d", res[0].Status, res[0].Err, keysOf(srv.seen()), second.Stats().Syncs)
		require.Equal(t, 1, srv.chargeCount())
		require.Equal(t, int64(1), second.Stats().Syncs, "the fingerprint-named done was not synced")
	})
}

// on a hashed-id journal, Resume names a fingerprint-named action
// "sha256:..." while a live identical request is named "fp:...": two
// flights of one action, two sends of one key, the second drawing 409s.
func TestResumeHashedJoinsLiveFlight(t *testing.T) {
	t.Parallel()
	resumeInEachIDMode(t, func(t *testing.T, srv *payServer, _ string, _ []filejournal.Option, second *idemretry.Transport) {
		srv.mu.Lock()
		srv.delay = 300 * time.Millisecond
		srv.mu.Unlock()
		srv.forgetKeys() // server lost it: it charges (slowly) again, 409 meanwhile
		app := resumerOfU(t, second, srv)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = sendErr(second, post(t, context.Background(), srv.URL, `{"order":"U"}`))
		}()
		time.Sleep(50 * time.Millisecond) // the live request is in flight
		_, err := second.Resume(context.Background(), app, 0)
		require.NoError(t, err)
		wg.Wait()
		reqs := srv.seen()
		t.Logf("requests after restart=%d keys=%v", len(reqs)-1, keysOf(reqs))
		require.Len(t, reqs, 2, "one flight per action: one request after the restart")
	}, idemretry.WithBackOff(constant(50*time.Millisecond)), idemretry.WithMaxRetries(20))
}

// the unsynced done of R3 costs a charge: a crash right after Resume
// leaves the resumed unnamed payment pending on disk; the user's deliberate
// identical repeat then reuses the old key and is answered with the old
// payment's replay: charged once, told twice.
func TestResumeHashedCrashThenRepeatIsCharged(t *testing.T) {
	t.Parallel()
	resumeInEachIDMode(t, func(t *testing.T, srv *payServer, dir string, fo []filejournal.Option, second *idemretry.Transport) {
		_, err := second.Resume(context.Background(), resumerOfU(t, second, srv), 0)
		require.NoError(t, err)
		crashed := copyDir(t, dir) // the process dies now
		second.Close()

		third, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(crashed, fo...))
		require.NoError(t, err)
		defer third.Close()
		resp, err := third.RoundTrip(post(t, context.Background(), srv.URL, `{"order":"U"}`)) // a deliberate second payment
		require.NoError(t, err)
		resp.Body.Close()
		t.Logf("repeat: %d replayed=%v charges=%d", resp.StatusCode, idemretry.IsReplay(resp), srv.chargeCount())
		require.Equal(t, 2, srv.chargeCount(), "the deliberate repeat was answered with the old payment's replay")
	})
}

// unnamedPaymentLeftPending makes an unnamed payment whose answer is lost
// after the server charged it, in a file journal (hashing its ids or not)
// that the Transport then leaves: what a crash leaves for Resume.
func unnamedPaymentLeftPending(t *testing.T, hashed bool) (*payServer, string, []filejournal.Option) {
	t.Helper()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	dir := t.TempDir()
	var fo []filejournal.Option
	if hashed {
		fo = append(fo, filejournal.WithHashedIDs())
	}
	first, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir, fo...), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = first.RoundTrip(post(t, context.Background(), srv.URL, `{"order":"U"}`))
	require.Error(t, err)
	require.NoError(t, first.Close())
	return srv, dir, fo
}

// resumeInEachIDMode runs f on a plain and on a hashing file journal, each
// holding the payment unnamedPaymentLeftPending leaves, with a second
// Transport (with opts) opened on it; f may close it.
func resumeInEachIDMode(t *testing.T, f func(t *testing.T, srv *payServer, dir string, fo []filejournal.Option, second *idemretry.Transport), opts ...idemretry.Option) {
	for _, hashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hashed"}[hashed], func(t *testing.T) {
			srv, dir, fo := unnamedPaymentLeftPending(t, hashed)
			second, err := idemretry.NewTransport(nil, append([]idemretry.Option{idemretry.WithJournalDir(dir, fo...)}, opts...)...)
			require.NoError(t, err)
			defer second.Close()
			f(t, srv, dir, fo, second)
		})
	}
}

// resumerOfU rebuilds the one unnamed payment, under whatever id the
// journal lists it (a hashing journal lists a digest, not "fp:...").
func resumerOfU(t *testing.T, tr *idemretry.Transport, srv *payServer) *appResumer {
	t.Helper()
	app := &appResumer{url: srv.URL, orders: map[string]string{}, unnamed: []string{`{"order":"U"}`}}
	recs, err := tr.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	app.orders[recs[0].ActionID] = `{"order":"U"}`
	return app
}

// copyDir copies the journal's files as a crash would leave them on disk
// (what was written, not what was only in memory).
func copyDir(t *testing.T, from string) string {
	to := t.TempDir()
	ents, err := os.ReadDir(from)
	require.NoError(t, err)
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(to, e.Name()), b, 0o600))
	}
	return to
}

// Issue 30, item 2: Resume kept only the status, so the app sent the
// payment again to learn its charge id. The answer's header and body reach
// it through the ResumeResult, with its outcome.
func TestResumeKeepsTheAnswer(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true} // charged, the answer lost
	j := journal.NewMemory()
	ctx := context.Background()
	leftPending(t, j, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, `{"order":"A"}`))
	recs, err := j.Unfinished(ctx)
	require.NoError(t, err)
	require.Len(t, recs, 1)

	tr := transportOver(t, j)
	results, err := tr.Resume(ctx, &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}, 0)
	require.NoError(t, err)
	require.Len(t, results, 1)
	res := results[0]
	require.NoError(t, res.Err)
	assert.Equal(t, http.StatusCreated, res.Status)
	assert.Equal(t, `{"charge":"ch_1"}`, string(res.Body), "the charge id")
	assert.False(t, res.BodyTruncated)
	assert.Equal(t, "true", res.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, idemretry.Outcome{Kind: idemretry.Done, Replayed: true, Action: "pay:A", Key: recs[0].Key, Attempts: 2,
		Status: http.StatusCreated, MaybeProcessed: true}, res.Outcome)
	assert.Equal(t, 1, srv.chargeCount())
}

// A body longer than DefaultMaxResumeBody is cut there, and says so.
func TestResumeCutsALongAnswer(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", idemretry.DefaultMaxResumeBody+100)
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			hijackAndClose(w)
			return true
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, long)
		return true
	}
	j := journal.NewMemory()
	ctx := context.Background()
	leftPending(t, j, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, `{"order":"A"}`))
	results, err := transportOver(t, j).Resume(ctx, &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}, 0)
	require.NoError(t, err)
	require.Len(t, results, 1)
	res := results[0]
	require.NoError(t, res.Err)
	assert.True(t, res.BodyTruncated)
	assert.Equal(t, long[:idemretry.DefaultMaxResumeBody], string(res.Body))
	assert.Equal(t, idemretry.Done, res.Outcome.Kind)
}

// Each action Resume handles has an outcome: the pending one resent and
// answered is Done, the outcome-unknown one resolved and forgotten is
// Refused (nothing of it is sent), the one the app could not rebuild is
// Pending.
func TestResumeResultOutcomes(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true, 2: true}
	j := journal.NewMemory()
	ctx := context.Background()
	leftPending(t, j, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, `{"order":"A"}`))
	leftPending(t, j, post(t, idemretry.WithAction(ctx, "pay:lost-order"), srv.URL, `{"order":"B"}`))
	old := journal.Record{ActionID: "pay:old", Key: "k-old", CreatedAt: time.Now().Add(-30 * time.Hour), State: journal.StatePending, Attempts: 1}
	_, _, err := j.Reserve(ctx, old, journal.ReuseAny)
	require.NoError(t, err)
	old.State = journal.StateUnknown
	require.NoError(t, j.Update(ctx, old))

	results, err := transportOver(t, j).Resume(ctx, &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}, 1)
	require.NoError(t, err)
	got := map[string]idemretry.ResumeResult{}
	for _, r := range results {
		got[r.Record.ActionID] = r
	}
	require.Len(t, got, 3)
	assert.Equal(t, idemretry.Done, got["pay:A"].Outcome.Kind)
	assert.True(t, got["pay:A"].Outcome.Replayed)

	assert.True(t, got["pay:old"].Forgotten)
	assert.Equal(t, idemretry.Outcome{Kind: idemretry.Refused, Action: "pay:old", Key: "k-old", Attempts: 1, MaybeProcessed: true,
		Reason: idemretry.ErrOutcomeUnknown}, got["pay:old"].Outcome)

	lost := got["pay:lost-order"]
	assert.Equal(t, idemretry.Pending, lost.Outcome.Kind, "%+v", lost.Outcome)
	assert.Equal(t, "pay:lost-order", lost.Outcome.Action)
	assert.Equal(t, lost.Record.Key, lost.Outcome.Key)
	assert.True(t, lost.Outcome.MaybeProcessed)
	assert.Equal(t, lost.Err, lost.Outcome.Reason)
	assert.Equal(t, 2, srv.chargeCount())
}

// Client.Resume: at start-up, a new Client on the directory of one that
// died resends its payment and hands the app the charge id.
func TestClientResumeHandsTheChargeID(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	dir := t.TempDir()
	ctx := idemretry.WithAction(context.Background(), "pay:A")
	first, err := idemretry.NewClient(idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = first.Do(post(t, ctx, srv.URL, `{"order":"A"}`))
	require.Error(t, err)
	require.NoError(t, first.Close())

	c, err := idemretry.NewClient(idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer c.Close()
	results, err := c.Resume(context.Background(), &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}, 0)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.Equal(t, `{"charge":"ch_1"}`, string(results[0].Body))
	assert.Equal(t, idemretry.Done, results[0].Outcome.Kind)
	assert.EqualValues(t, 1, c.Stats().Resumed)
	assert.Equal(t, 1, srv.chargeCount())
}

// Resume reads and closes the final answer of each action it sends. Under a
// context that never ends, a body that never ends (one streamed forever, or
// one that stalls after its first bytes) must not keep Resume from
// returning: it is drained as any discarded body is, up to 64 KiB and for at
// most DefaultMaxDrainTime, and the action's outcome (201, recorded done)
// is what Resume reports.
func TestResumeBoundsTheFinalBodyDrain(t *testing.T) {
	for _, tc := range []struct {
		name string
		body func(w http.ResponseWriter, r *http.Request)
	}{
		{"streams forever", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			chunk := []byte(strings.Repeat("x", 1024))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond)
			}
		}},
		{"stalls", func(w http.ResponseWriter, r *http.Request) {
			stallBody(w, r, http.StatusCreated, `{"id":`, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					hijackAndClose(w) // the first answer is lost: the action stays pending
					return
				}
				tc.body(w, r)
			})
			j := journal.NewMemory()
			leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))

			second, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer second.Close()
			r := &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}

			// ctx has no deadline and is cancelled only to free the test
			// if Resume hangs.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Now()
			done := resumeAsync(ctx, second, r, 1)
			var got resumed
			select {
			case got = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Resume did not return within 10 s of a final answer whose body never ends")
			}
			took := time.Since(start)
			require.NoError(t, got.err)
			require.Len(t, got.res, 1)
			assert.True(t, got.res[0].Sent)
			assert.Equal(t, http.StatusCreated, got.res[0].Status)
			assert.NoError(t, got.res[0].Err)
			assert.True(t, got.res[0].BodyTruncated, "a body cut says so")
			assert.Less(t, took, 5*time.Second, "the drain is bounded by DefaultMaxDrainTime (%v)", idemretry.DefaultMaxDrainTime)
			left, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, left, "the 201 is recorded done")
			checkNoPackageGoroutines(t)
		})
	}
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	if childtest.IsChild() {
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
	cmd := childtest.Command("TestResumeResolvePanicIsTheCallersToRecover")
	out, err := cmd.CombinedOutput()
	first := strings.SplitN(string(out), "\n", 2)[0]
	require.NoError(t, err, "the process died of the app's panic in Resolve, which Resume's caller recovers: %s", first)
	assert.Contains(t, string(out), "recovered: the app's Resolve has a bug")
}

// drainOnClose is a base RoundTripper over a real *http.Transport
// whose response bodies drain what is left when closed, to keep the
// connection, as many middlewares do: its Close returns once the body
// ends or the request's context does.
type drainOnClose struct{ base http.RoundTripper }

func (d drainOnClose) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(r)
	if err == nil {
		resp.Body = &drainingBody{ReadCloser: resp.Body}
	}
	return resp, err
}

type drainingBody struct{ io.ReadCloser }

func (b *drainingBody) Close() error {
	_, _ = io.Copy(io.Discard, b.ReadCloser)
	return b.ReadCloser.Close()
}

// bodyResumer rebuilds every pending action as a POST of body to url, and
// resolves nothing.
type bodyResumer struct{ url, body string }

func (r bodyResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(context.Background(), http.MethodPost, r.url, strings.NewReader(r.body))
}

func (bodyResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// firstDropped is a server whose first request's connection is cut
// without an answer (the action is left pending), and which answers the
// others with h.
func firstDropped(t *testing.T, h http.HandlerFunc) string {
	var n atomic.Int32
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			hijackAndClose(w)
			return
		}
		h(w, r)
	}).URL
}

// streamForever answers status and then a body that never ends, until
// the request does.
func streamForever(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		chunk := []byte(strings.Repeat("x", 4096))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

// Resume's doc: "Each response's body is discarded as the Transport
// discards any (at most DefaultMaxDrain bytes read, for at most
// DefaultMaxDrainTime) and closed". Resume stopped its drain timer before
// closing the body, so a body whose Close waits for its end (a base that
// drains on Close, over a body that never ends) held Resume until its
// context ended: here never. The Transport's own discard closes the body
// within the timer, which cuts the attempt.
//
// Found in review hv3 (8c60b37; was TestHV3ResumeDrainBoundsTheBodysClose).
func TestResumeDrainBoundsTheBodysClose(t *testing.T) {
	t.Parallel()
	url := firstDropped(t, streamForever(http.StatusCreated))
	j := journal.NewMemory()
	const body = `{"amount":7}`
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:hv3-resume-drain"), url, body))

	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := idemretry.NewTransport(drainOnClose{base}, idemretry.WithJournal(j))
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })

	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := resumeAsync(rctx, tr, bodyResumer{url: url, body: body}, 1)
	var got resumed
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		cancel() // let it go, so that the test ends
		<-done
		t.Fatalf("Resume still draining a discarded body 10 s on (DefaultMaxDrainTime %v)", idemretry.DefaultMaxDrainTime)
	}
	require.NoError(t, got.err)
	require.Len(t, got.res, 1)
	require.Equal(t, http.StatusCreated, got.res[0].Status)
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Empty(t, un, "the outcome is recorded whatever the body")
}

// README guarantee 5 holds for Resume too: Resume's context bounds the
// requests it sends ("ends when Resume's ctx does"), so its deadline is
// theirs, and no wait that would end after it starts. Resume gave the
// rebuilt request only its own context's deadline (none here), so a
// Retry-After of 3 s was waited for under a Resume with 1.5 s left, which
// ended it as a cancellation.
//
// Found in review hv3 (8c60b37; was TestHV3ResumeDeadlineStopsHopelessWaits).
func TestResumeDeadlineStopsHopelessWaits(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	url := firstDropped(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	j := journal.NewMemory()
	const body = `{"amount":8}`
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:hv3-resume-deadline"), url, body))

	tr := transportOver(t, j, idemretry.WithMaxRetries(3))
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res, err := tr.Resume(ctx, bodyResumer{url: url, body: body}, 1)
	beforeDeadline := ctx.Err() == nil
	require.Len(t, res, 1)
	require.Equal(t, int32(1), hits.Load())
	require.ErrorIs(t, res[0].Err, idemretry.ErrWaitExceedsDeadline,
		"a Retry-After of 3 s was waited for with 1.5 s left of Resume's context: %v", res[0].Err)
	require.Equal(t, http.StatusServiceUnavailable, res[0].Status)
	require.True(t, beforeDeadline, "Resume waited for its deadline instead of returning at once")
	require.NoError(t, err)
}

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
	t.Parallel()
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
	require.Eventually(t, func() bool { return strings.Contains(goroutineStacks(), "(*flights).wait") },
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	if childtest.IsChild() {
		resumeOverNilBodyBase(t)
		return
	}
	cmd := childtest.Command("TestResumeNilBodyDoesNotPanic")
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
	t.Parallel()
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

// A resent action answered 101 Switching Protocols: its body is the
// upgraded connection, which no one holds once Resume returns, and which
// an ended context does not cut. Resume closes it unread and returns
// (it read it for a body, and hung for as long as the server kept the
// connection open).
func TestResumeUpgradedAnswerClosedUnread(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			hijackAndClose(w) // the first answer lost
			return true
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return true
		}
		defer conn.Close()
		go func() { <-hold; conn.Close() }() // at the test's end, whatever the client did
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: charge-stream\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		_, _ = conn.Read(make([]byte, 1)) // until the client closes it
		return true
	}
	defer close(hold)
	j := journal.NewMemory()
	ctx := context.Background()
	leftPending(t, j, post(t, idemretry.WithAction(ctx, "pay:A"), srv.URL, `{"order":"A"}`))
	got := resumeAsync(ctx, transportOver(t, j), &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}, 0)
	var r resumed
	select {
	case r = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("Resume never returned: it read the upgraded connection as a body")
	}
	require.NoError(t, r.err)
	require.Len(t, r.res, 1)
	res := r.res[0]
	require.NoError(t, res.Err)
	assert.Equal(t, http.StatusSwitchingProtocols, res.Status)
	assert.Empty(t, res.Body)
	assert.Equal(t, idemretry.Done, res.Outcome.Kind)
}

// rebuildCounter is an appResumer that counts the Rebuild calls of each
// action.
type rebuildCounter struct {
	*appResumer
	mu    sync.Mutex
	calls map[string]int
}

func (r *rebuildCounter) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	r.mu.Lock()
	r.calls[rec.ActionID]++
	r.mu.Unlock()
	return r.appResumer.Rebuild(ctx, rec)
}

// Three payments were charged and their answers lost; then one bit of the
// file journal flipped on disk, in the key of the last frame that holds
// pay:bad, with intact frames after it. Open refuses the file and names
// pay:bad; opened with WithSalvage, Resume resends the two intact payments
// (the server replays them: nothing is charged again) and gives pay:bad a
// result of its own, by id: journal.ErrCorruptRecord, Refused and maybe
// processed, nothing rebuilt or sent. A new send of pay:bad is refused too
// (its lost key may have been charged), until the app, having reconciled
// it, forgets it by that id. Before, the salvage lost pay:bad silently and
// a new send of it made a second charge under a new key; a journal whose
// Unfinished failed on one record made Resume resume nothing.
func TestResumeResendsTheIntactActionsBesideADamagedRecord(t *testing.T) {
	ctx := context.Background()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true, 2: true, 3: true} // charged, answers lost
	dir := t.TempDir()
	fj, err := filejournal.Open(dir)
	require.NoError(t, err)
	orders := map[string]string{}
	for _, o := range []string{"good-1", "bad", "good-2"} {
		id, body := "pay:"+o, `{"order":"`+o+`"}`
		orders[id] = body
		leftPending(t, fj, post(t, idemretry.WithAction(ctx, id), srv.URL, body))
		require.NoError(t, fj.Sync(ctx)) // its updates in frames of their own
	}
	require.NoError(t, fj.Close())
	path := filepath.Join(dir, "journal")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	at := strings.LastIndex(string(data), "pay:bad") + len("pay:bad") // the first byte of its key
	require.Greater(t, at, len("pay:bad"))
	data[at] ^= 1 << 4
	require.NoError(t, os.WriteFile(path, data, 0o600))

	_, err = filejournal.Open(dir)
	var ce *filejournal.CorruptionError
	require.ErrorAs(t, err, &ce, "Open of the damaged file")
	assert.Contains(t, ce.Actions, "pay:bad", "%v", ce)

	fj, err = filejournal.Open(dir, filejournal.WithSalvage())
	require.NoError(t, err)
	defer fj.Close()
	tr := transportOver(t, fj)
	app := &rebuildCounter{appResumer: &appResumer{url: srv.URL, orders: orders}, calls: map[string]int{}}
	res, err := tr.Resume(ctx, app, 0)
	for _, r := range res {
		t.Logf("%s: sent %v, status %d, outcome %v, %v", r.Record.ActionID, r.Sent, r.Status, r.Outcome.Kind, r.Err)
	}
	require.NoError(t, err, "%d results", len(res))
	require.Len(t, res, 3)
	byID := map[string]idemretry.ResumeResult{}
	for _, r := range res {
		byID[r.Record.ActionID] = r
	}
	for _, id := range []string{"pay:good-1", "pay:good-2"} {
		r := byID[id]
		assert.NoError(t, r.Err, id)
		assert.True(t, r.Sent, id)
		assert.Equal(t, http.StatusCreated, r.Status, id)
		assert.True(t, r.Outcome.Replayed, "%s: the server's replay", id)
	}
	bad, ok := byID["pay:bad"]
	require.True(t, ok, "no result of the damaged record")
	require.ErrorIs(t, bad.Err, journal.ErrCorruptRecord)
	assert.ErrorIs(t, bad.Err, filejournal.ErrCorrupt)
	assert.False(t, bad.Sent)
	assert.False(t, bad.Forgotten)
	assert.Equal(t, idemretry.Refused, bad.Outcome.Kind)
	assert.True(t, bad.Outcome.MaybeProcessed, "its first attempt was charged")
	assert.Equal(t, "pay:bad", bad.Outcome.Action)
	assert.Zero(t, app.calls["pay:bad"], "the damaged record was rebuilt")
	assert.Equal(t, 3, srv.chargeCount(), "a payment was charged again")
	assert.Len(t, srv.seen(), 5, "the two intact payments resent, once each")

	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:bad"), srv.URL, orders["pay:bad"]))
	if resp != nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, journal.ErrCorruptRecord, "a new send of the damaged payment")
	assert.Len(t, srv.seen(), 5, "the damaged payment was sent again")

	// The app reconciles it with the provider by hand, then forgets it by
	// the id its result gives.
	require.NoError(t, tr.Journal().Forget(ctx, bad.Record.ActionID))
	un, err := fj.Unfinished(ctx)
	require.NoError(t, err)
	assert.Empty(t, un)
}

// failingListJournal is a Memory whose Unfinished fails whole on a corrupt
// record, as journals did before journal.CorruptRecordsError (and may
// still): nil and an error wrapping journal.ErrCorruptRecord.
type failingListJournal struct{ *journal.Memory }

func (failingListJournal) Unfinished(context.Context) ([]journal.Record, error) {
	return nil, fmt.Errorf("old: unfinished: %w: action %q: attempts -1", journal.ErrCorruptRecord, "pay:bad")
}

// A journal that fails Unfinished whole on a corrupt record stays correct:
// Resume resumes nothing, sends nothing, and says why.
func TestResumeStopsWhereTheJournalFailsOnACorruptRecord(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop[1] = true
	mem := journal.NewMemory()
	leftPending(t, mem, post(t, idemretry.WithAction(context.Background(), "pay:good"), srv.URL, `{"order":"good"}`))
	tr := transportOver(t, failingListJournal{mem})
	res, err := tr.Resume(context.Background(), &appResumer{url: srv.URL, orders: map[string]string{"pay:good": `{"order":"good"}`}}, 0)
	require.ErrorIs(t, err, journal.ErrCorruptRecord)
	assert.Empty(t, res)
	assert.Len(t, srv.seen(), 1, "nothing resent")
	un, err := mem.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Len(t, un, 1, "the pending payment is kept for the next Resume")
}

// unnamingListJournal is a Memory whose Unfinished lists its records and
// returns err beside them: a third-party journal's CorruptRecordsError
// that does not name (all) the records it left out.
type unnamingListJournal struct {
	*journal.Memory
	err error
}

func (j unnamingListJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Memory.Unfinished(ctx)
	if err != nil {
		return nil, err
	}
	return recs, j.err
}

// A journal's CorruptRecordsError that says records were left out without
// naming them all (no IDs, or more Errs than IDs, as a third-party journal
// may fill it) cannot be given a result per record: Resume resumes the
// records listed and returns the error, so the caller learns that some of
// the unfinished actions were not listed. Before, Resume returned a nil
// error and a result for the listed records only: the unnamed ones, which
// may have been charged, were dropped without a word.
func TestResumeSaysWhatAnUnnamingCorruptRecordsErrorLeftOut(t *testing.T) {
	lost := fmt.Errorf("thirdparty: row 17: %w", journal.ErrCorruptRecord)
	for name, ce := range map[string]*journal.CorruptRecordsError{
		"no IDs":             {Errs: []error{lost}},
		"nothing filled":     {},
		"more Errs than IDs": {IDs: []string{"pay:named"}, Errs: []error{lost, lost}},
		"a nil pointer":      nil, // a journal's typed nil: var bad *CorruptRecordsError; return out, bad
	} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.commitThenDrop[1] = true
			mem := journal.NewMemory()
			leftPending(t, mem, post(t, idemretry.WithAction(context.Background(), "pay:good"), srv.URL, `{"order":"good"}`))
			var listErr error = ce
			if ce != nil {
				listErr = fmt.Errorf("thirdparty: unfinished: %w", ce)
			}
			tr := transportOver(t, unnamingListJournal{mem, listErr})
			res, err := tr.Resume(context.Background(), &appResumer{url: srv.URL, orders: map[string]string{"pay:good": `{"order":"good"}`}}, 0)
			require.Error(t, err, "the records left out unnamed")
			assert.ErrorIs(t, err, journal.ErrCorruptRecord)
			var got *journal.CorruptRecordsError
			assert.ErrorAs(t, err, &got)
			assert.NotContains(t, err.Error(), "0 unfinished records", "the message of records left out unnamed")
			named := 0
			if ce != nil {
				named = len(ce.IDs)
			}
			require.Len(t, res, 1+named, "the listed record resumed, each named one reported")
			assert.Equal(t, "pay:good", res[0].Record.ActionID)
			assert.NoError(t, res[0].Err)
			assert.True(t, res[0].Sent)
			for _, r := range res[1:] {
				assert.ErrorIs(t, r.Err, journal.ErrCorruptRecord)
			}
		})
	}
}
