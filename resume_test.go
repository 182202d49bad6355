package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
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

func filejournalGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "idemretry/filejournal.")
}

// A Transport that is dropped without Close closes the journal it opened
// once it is garbage collected: no goroutine is left, the lock is released.
func TestDroppedTransportReleasesJournal(t *testing.T) {
	srv := newPayServer(t)
	dir := t.TempDir()
	before := filejournalGoroutines()
	func() {
		tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:dropped"), srv.URL, "x"))
		require.NoError(t, err)
		readAll(t, resp)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for filejournalGoroutines() > before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	assert.LessOrEqual(t, filejournalGoroutines(), before, "the dropped Transport's journal is still running")
	again, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err, "the lock is released")
	require.NoError(t, again.Close())
}
