package idemretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
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

// appResumer rebuilds requests from what the app itself keeps (its orders),
// and resolves unknown actions by asking the "provider".
type appResumer struct {
	url      string
	orders   map[string]string // action id or key -> body
	unnamed  []string          // bodies of payments sent without a name
	mu       sync.Mutex
	resolved []string
}

func (a *appResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	body, ok := a.orders[rec.ActionID]
	if !ok {
		body, ok = a.orders[rec.Key]
	}
	if !ok && strings.HasPrefix(rec.ActionID, "fp:") && len(a.unnamed) > 0 {
		body, ok = a.unnamed[0], true // the app resends its one unnamed payment
	}
	if !ok {
		return nil, errors.New("unknown order")
	}
	return http.NewRequestWithContext(ctx, http.MethodPost, a.url, strings.NewReader(body))
}

func (a *appResumer) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	a.mu.Lock()
	a.resolved = append(a.resolved, rec.Key)
	a.mu.Unlock()
	return true, nil
}

// A process that died with payments whose answers were lost restarts and
// resumes: each pending action is sent again under its own key (the server
// replays, charging nothing more), each unknown one is resolved and
// forgotten.
func TestResumeAfterRestart(t *testing.T) {
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
	resumeInEachIDMode(t, func(t *testing.T, srv *payServer, _ string, _ []filejournal.Option, second *idemretry.Transport) {
		srv.mu.Lock()
		srv.delay = 300 * time.Millisecond
		srv.stored = map[string]storedAnswer{} // server lost it: it charges (slowly) again, 409 meanwhile
		srv.mu.Unlock()
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

// A resent action answered 101 Switching Protocols: its body is the
// upgraded connection, which no one holds once Resume returns, and which
// an ended context does not cut. Resume closes it unread and returns
// (it read it for a body, and hung for as long as the server kept the
// connection open).
func TestResumeUpgradedAnswerClosedUnread(t *testing.T) {
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
