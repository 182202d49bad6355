package idemretry_test

// Review round 2 (issue 7 follow-ups): resume, hashed ids, stalled peeks,
// a dropped Transport, the reason an unknown action is refused with.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// R1: a retryable 409 whose JSON body stalls: the classifier's peek has no
// bound, so the retries (and RoundTrip) are held until the caller's context
// ends, instead of the 200 ms drain that bounds every discarded body.
func TestStalledErrorBodyDoesNotHoldRetries(t *testing.T) {
	release := make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		if n.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":{"code":"idempotency_key_in_use"`)
			w.(http.Flusher).Flush()
			select { // the body stalls
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1"}`)
	}))
	defer srv.Close()
	defer close(release)
	tr, _, _ := newTestTransport(t, idemretry.WithBackOff(constant(time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:stall"), srv.URL, `{"a":1}`))
	elapsed := time.Since(start)
	if resp != nil {
		resp.Body.Close()
	}
	t.Logf("err=%v elapsed=%v attempts=%d", err, elapsed, n.Load())
	require.Less(t, elapsed, 2*time.Second, "RoundTrip held by a stalled 409 body")
	require.NoError(t, err)
}

// R2: Resume of a fingerprint-named action whose Rebuild returns another
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

// R3: on a journal that hashes ids, a resumed fingerprint-named action is
// named WithAction("sha256:..."), so it is no longer "by fingerprint": its
// done is not synced (Stats.Syncs), unlike on a plain journal.
func TestResumeHashedFingerprintDoneSynced(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hashed"}[hashed], func(t *testing.T) {
			srv, dir, fo := unnamedPaymentLeftPending(t, hashed)

			second, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir, fo...))
			require.NoError(t, err)
			defer second.Close()
			app := resumerOfU(t, second, srv)
			res, err := second.Resume(context.Background(), app, 0)
			require.NoError(t, err)
			t.Logf("status=%d err=%v keys=%v syncs=%d", res[0].Status, res[0].Err, keysOf(srv.seen()), second.Stats().Syncs)
			require.Equal(t, 1, srv.chargeCount())
			require.Equal(t, int64(1), second.Stats().Syncs, "the fingerprint-named done was not synced")
		})
	}
}

// R4: on a hashed-id journal, Resume names a fingerprint-named action
// "sha256:..." while a live identical request is named "fp:...": two
// flights of one action, two sends of one key, the second drawing 409s.
func TestResumeHashedJoinsLiveFlight(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hashed"}[hashed], func(t *testing.T) {
			srv, dir, fo := unnamedPaymentLeftPending(t, hashed)

			srv.mu.Lock()
			srv.delay = 300 * time.Millisecond
			srv.stored = map[string]storedAnswer{} // server lost it: it charges (slowly) again, 409 meanwhile
			srv.mu.Unlock()
			second, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir, fo...), idemretry.WithBackOff(constant(50*time.Millisecond)), idemretry.WithMaxRetries(20))
			require.NoError(t, err)
			defer second.Close()
			app := resumerOfU(t, second, srv)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := second.RoundTrip(post(t, context.Background(), srv.URL, `{"order":"U"}`))
				if err == nil {
					resp.Body.Close()
				}
			}()
			time.Sleep(50 * time.Millisecond) // the live request is in flight
			_, err = second.Resume(context.Background(), app, 0)
			require.NoError(t, err)
			wg.Wait()
			reqs := srv.seen()
			t.Logf("requests after restart=%d keys=%v", len(reqs)-1, keysOf(reqs))
			require.Len(t, reqs, 2, "one flight per action: one request after the restart")
		})
	}
}

// R5: the journal of a dropped Transport is closed by the GC cleanup while
// the app still holds it through Journal().
func TestDroppedTransportLeavesHandedOutJournal(t *testing.T) {
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	j := tr.Journal()
	tr = nil
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	_, err = j.Unfinished(context.Background())
	t.Logf("Unfinished after dropping the Transport: %v", err)
	require.NoError(t, err)
}

// R6: a resend of an action refused as reused reports ErrKeyReused?
func TestKeyReusedResendRefused(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(http.StatusUnprocessableEntity, "Content-Type", "application/problem+json"))
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(422)
			w.Write([]byte(`{"title":"Idempotency-Key is already used"}`))
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:R")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"a":1}`))
	require.ErrorIs(t, err, idemretry.ErrKeyReused)
	_, err = tr.RoundTrip(post(t, ctx, srv.URL, `{"a":1}`))
	t.Logf("resend: %v; requests=%d", err, len(srv.seen()))
	require.Len(t, srv.seen(), 1)
	require.True(t, errors.Is(err, idemretry.ErrOutcomeUnknown), "resend refused with %v", err)
}

// copyDir copies the journal's files as a crash would leave them on disk
// (what was written, not what was only in memory).
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

// R3b: the unsynced done of R3 costs a charge: a crash right after Resume
// leaves the resumed unnamed payment pending on disk; the user's deliberate
// identical repeat then reuses the old key and is answered with the old
// payment's replay: charged once, told twice.
func TestResumeHashedCrashThenRepeatIsCharged(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hashed"}[hashed], func(t *testing.T) {
			srv, dir, fo := unnamedPaymentLeftPending(t, hashed)

			second, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir, fo...))
			require.NoError(t, err)
			app := resumerOfU(t, second, srv)
			_, err = second.Resume(context.Background(), app, 0)
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
}

func TestParkedUnnamedKeepsKey(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503), status(503))
	tr, _, _ := newTestTransport(t, idemretry.WithRetryBudget(1, 0))
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"x":2}`))
	require.ErrorIs(t, err, idemretry.ErrParked)
	srv.script = nil
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"x":2}`))
	require.NoError(t, err)
	resp.Body.Close()
	s := srv.seen()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, s[len(s)-2].Key, s[len(s)-1].Key)
}
