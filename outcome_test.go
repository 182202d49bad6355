package idemretry_test

// What RoundTrip records and reports as an action's outcome (outcome.go): a
// 503 at the deadline stays pending, a done is durable before RoundTrip
// returns, MaybeProcessed, and a journal that fails or hangs when the outcome
// is recorded.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
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
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// I3: a 503 whose context ended as it arrived is not a definitive answer: the
// action stays pending, and a fingerprint-identified resend keeps its key.
func TestRetryableStatusAfterCancelStaysPending(t *testing.T) {
	t.Parallel()
	j := journal.NewMemory()
	var keys []string
	var cancel context.CancelFunc
	n := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n++
		if n == 1 {
			cancel() // e.g. the deadline passes as the 503's headers arrive
			return resp(http.StatusServiceUnavailable, r), nil
		}
		return resp(http.StatusCreated, r), nil
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(newFakeClock()))
	require.NoError(t, err)
	defer tr.Close()

	ctx, c := context.WithCancel(context.Background())
	cancel = c
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.example/v1/charges", strings.NewReader(`{"amount":100}`))
	r1, err := tr.RoundTrip(req)
	require.NoError(t, err)
	r1.Body.Close()
	require.Equal(t, 503, r1.StatusCode)

	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Len(t, un, 1, "an action answered 503 must stay pending (outcome unknown)")

	// The app resends the same payment (same method, URL, body).
	req2, _ := http.NewRequest(http.MethodPost, "http://pay.example/v1/charges", strings.NewReader(`{"amount":100}`))
	r2, err := tr.RoundTrip(req2)
	require.NoError(t, err)
	r2.Body.Close()
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1], "resend of an unknown-outcome action got a new key")
}

// ActionError.MaybeProcessed is true when a previous run may have sent the
// action: a pending record that this RoundTrip did not create, even one that
// says Attempts == 0 (a crash during the first attempt leaves that).
func TestMaybeProcessedAfterRestart(t *testing.T) {
	t.Parallel()
	j := journal.NewMemory()
	clk := newFakeClock()
	url := "http://" + closedAddr(t) + "/v1/charges" // the resend's dial is refused
	// What a process killed during its first attempt leaves behind: the
	// durable reservation, with the attempt count never updated.
	_, _, err := j.Reserve(context.Background(), journal.Record{
		ActionID: "pay:crashed", Key: "0b9f2f5e-8a7a-4d6e-9c43-2d1a5c7e8f90",
		Fingerprint: fpOf(t, url, "x"), CreatedAt: clk.Now(), State: journal.StatePending,
	}, journal.ReuseAny)
	require.NoError(t, err)

	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:crashed"), url, "x"))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.True(t, ae.MaybeProcessed, "the previous run's attempt may have reached the server: %v", err)

	// The same after the key window: ErrKeyWindowExpired with MaybeProcessed false.
	_, _, err = j.Reserve(context.Background(), journal.Record{
		ActionID: "pay:crashed2", Key: "1b9f2f5e-8a7a-4d6e-9c43-2d1a5c7e8f90",
		Fingerprint: fpOf(t, url, "x"), CreatedAt: clk.Now(), State: journal.StatePending,
	}, journal.ReuseAny)
	require.NoError(t, err)
	clk.Advance(25 * time.Hour)
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:crashed2"), url, "x"))
	require.ErrorAs(t, err, &ae)
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	assert.True(t, ae.MaybeProcessed, "unknown-outcome action reported as never processed: %v", err)
}

// fpOf gets the Transport's fingerprint of a POST by letting a throwaway
// Transport reserve it.
func fpOf(t *testing.T, url, body string) journal.Fingerprint {
	j := journal.NewMemory()
	base := rtFunc(func(r *http.Request) (*http.Response, error) { r.Body.Close(); return resp(200, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j))
	require.NoError(t, err)
	req, _ := http.NewRequestWithContext(idemretry.WithAction(context.Background(), "a"), http.MethodPost, url, strings.NewReader(body))
	roundTrip(t, tr, req)
	rec, _, err := j.Reserve(context.Background(), journal.Record{ActionID: "a", Key: "probe", CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
	require.NoError(t, err)
	return rec.Fingerprint
}

// A done action stays done when a later resend of it fails: its outcome is
// known, and it must not turn up among the unfinished actions.
func TestDoneActionStaysDoneAfterFailedResend(t *testing.T) {
	srv := newPayServer(t)
	tr, j, _ := newTestTransport(t, idemretry.WithMaxRetries(1))
	ctx := idemretry.WithAction(context.Background(), "pay:done-then-down")
	roundTrip(t, tr, post(t, ctx, srv.URL, "x"))

	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { hijackAndClose(w); return true }
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.Error(t, err)
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un)
}

// A fingerprint-named action's "done" is durable when RoundTrip returns: a
// crash right after (the journal's lazy updates unwritten) must not make a
// deliberate repeat of the same request reuse the old key, which the server
// would answer with the first payment's replay.
func TestFingerprintDoneDurableBeforeReturn(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(&http.Transport{},
		idemretry.WithJournalDir(dir, filejournal.WithFlushInterval(time.Hour)))
	require.NoError(t, err)
	roundTrip(t, tr, post(t, context.Background(), srv.URL, `{"amount":5}`))

	// kill -9 now: what is on disk is the journal file as it is.
	img := t.TempDir()
	data, err := os.ReadFile(filepath.Join(dir, "journal"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(img, "journal"), data, 0o600))
	require.NoError(t, tr.Close())

	again, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(img))
	require.NoError(t, err)
	defer again.Close()
	resp, err := again.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	keys := keysOf(srv.seen())
	require.Len(t, keys, 2)
	assert.NotEqual(t, keys[0], keys[1], "the repeat is a new action")
	assert.Equal(t, 2, srv.chargeCount())
}

type syncJournal struct {
	*journal.Memory
	sync func(ctx context.Context) error
}

func (j syncJournal) Sync(ctx context.Context) error { return j.sync(ctx) }

// finish Syncs a fingerprint-named action's "done" with the caller's
// cancellation stripped: a journal whose sync stalls (slow disk, NFS, a SQL
// journal) holds RoundTrip past the caller's deadline although the response
// is in hand.
func TestDoneSyncHonoursDeadline(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	defer close(block)
	j := syncJournal{journal.NewMemory(), func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-block:
			return nil
		}
	}}
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(newFakeClock()))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() {
		_ = sendErr(tr, post(t, ctx, "http://pay.example/", "x"))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("RoundTrip still blocked in Sync 1.9 s after its context's deadline")
	}
}

// A failed Sync of a fingerprint-named "done" is dropped without a trace:
// not returned, not logged, although README promises the done is durable
// before RoundTrip returns.
func TestDoneSyncFailureLogged(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	j := syncJournal{journal.NewMemory(), func(context.Context) error { return errors.New("injected EIO") }}
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(newFakeClock()),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)
	err = sendErr(tr, post(t, context.Background(), "http://pay.example/", "x"))
	require.True(t, err != nil || bytes.Contains(logs.Bytes(), []byte("EIO")), "sync failure neither returned nor logged; logs: %q", logs.String())
}

// Issue 7, item 1: net/http resends a request that carries an Idempotency-Key by
// itself when a reused keep-alive connection breaks after the request was
// written; if that hidden resend fails to dial, only the dial error is seen.
// The server did charge: MaybeProcessed must say so.
func TestMaybeProcessedAfterHiddenResend(t *testing.T) {
	t.Parallel()
	var charges atomic.Int32
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/warm" {
			w.WriteHeader(http.StatusOK)
			return
		}
		charges.Add(1)
		srv.Listener.Close() // the resend cannot connect
		hijackAndClose(w)    // the answer is lost after the charge
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, inMemory(),
		idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()

	warm, err := base.RoundTrip(httptestGet(t, srv.URL+"/warm"))
	require.NoError(t, err)
	readAll(t, warm) // the connection goes back to the pool, to be reused

	_, err = tr.RoundTrip(post(t, context.Background(), srv.URL+"/pay", `{"amount":5}`))
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, int32(1), charges.Load(), "the server charged")
	assert.True(t, ae.MaybeProcessed, "the server charged, but MaybeProcessed is false (err: %v)", err)
}

// cancelAtAnswer is a base transport that ends the caller's context just as
// the server's answer arrives: a deadline landing on a final answer.
type cancelAtAnswer struct {
	base   http.RoundTripper
	cancel context.CancelFunc
}

func (c *cancelAtAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	c.cancel()
	return resp, err
}

// Issue 7, item 3: a final answer that arrives as the caller's context ends is
// returned, so it must be recorded done; else a deliberate repeat of an
// unnamed payment reuses its key and gets a replay instead of a charge.
func TestFinalAnswerAtDeadlineIsRecordedDone(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	j := journal.NewMemory()
	http1 := &http.Transport{}
	defer http1.CloseIdleConnections()
	cb := &cancelAtAnswer{base: http1}
	tr, err := idemretry.NewTransport(cb, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()

	ctx, cancel := context.WithCancel(context.Background())
	cb.cancel = cancel
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":9}`))
	require.NoError(t, err)
	require.Equal(t, 201, resp.StatusCode)
	resp.Body.Close()
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un, "a 201 was returned but the journal says pending")

	cb.cancel = func() {}
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":9}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, srv.chargeCount(), "the deliberate second payment was answered with the first one's replay")
}

// overFlakyJournal returns a payment server and a Transport, with its own
// HTTP connections, over a flakyJournal the test can make fail or hang.
func overFlakyJournal(t *testing.T) (*payServer, *flakyJournal, *idemretry.Transport) {
	t.Helper()
	j := &flakyJournal{Memory: journal.NewMemory()}
	return newPayServer(t), j, transportOver(t, j)
}

// Issue 7, item 4: an update to done that fails must not leave a record that makes
// the next deliberate identical payment reuse the old key (two payments, one
// charge, and a 201 that nobody paid).
func TestFailedDoneUpdateNeverReusesTheKey(t *testing.T) {
	t.Parallel()
	srv, j, tr := overFlakyJournal(t)

	j.failDone.Store(true)
	roundTrip(t, tr, post(t, context.Background(), srv.URL, `{"amount":3}`))

	// Still failing: the second payment is refused, not sent under the old key.
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":3}`))
	if err == nil {
		body := readAll(t, resp)
		assert.Equal(t, 2, srv.chargeCount(), "second payment answered %d %s without a charge", resp.StatusCode, body)
	} else {
		assert.ErrorIs(t, err, errDiskGone)
		assert.Len(t, srv.seen(), 1, "nothing is sent while the outcome is not recorded")
	}

	// The journal heals: the outcome lands, and the repeat is a new payment.
	j.failDone.Store(false)
	roundTrip(t, tr, post(t, context.Background(), srv.URL, `{"amount":3}`))
	reqs := srv.seen()
	assert.NotEqual(t, reqs[0].Key, reqs[len(reqs)-1].Key)
	assert.Equal(t, len(reqs), srv.chargeCount(), "a request was answered with a replay")
}

// Issue 7, item 5: a journal that hangs when the outcome is recorded must not hold
// RoundTrip past the caller's deadline (beyond a documented grace).
func TestHangingJournalUpdateBoundedByDeadline(t *testing.T) {
	t.Parallel()
	srv, j, tr := overFlakyJournal(t)

	j.hang.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":8}`))
	took := time.Since(start)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Less(t, took, 500*time.Millisecond+time.Second, "RoundTrip with a 500 ms deadline took %v", took)
	j.hang.Store(false)
	require.NoError(t, tr.Close(), "Close lands the outcome the journal did not take in time")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, un)
}

// Give-ups a person can see: the reason is told by GiveUpReason and logged
// at Warn; a final answer has none.
func TestGiveUpReasons(t *testing.T) {
	var mu sync.Mutex
	answer := func(w http.ResponseWriter) { w.WriteHeader(503) }
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := answer
		mu.Unlock()
		a(w)
	})
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr, _, _ := newTestTransport(t, idemretry.WithLogger(logger), idemretry.WithMaxRetries(2))
	set := func(a func(http.ResponseWriter)) { mu.Lock(); answer = a; mu.Unlock() }
	send := func(ctx context.Context, body string) *http.Response {
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, body))
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}

	resp := send(context.Background(), "1")
	assert.Equal(t, 503, resp.StatusCode)
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted)
	assert.Contains(t, logs.String(), "gave up")
	assert.Contains(t, logs.String(), "attempts exhausted")

	set(func(w http.ResponseWriter) { w.Header().Set("Retry-After", "3600"); w.WriteHeader(429) })
	resp = send(context.Background(), "2")
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrRetryAfterTooLong)

	set(func(w http.ResponseWriter) { w.Header().Set("Retry-After", "20"); w.WriteHeader(503) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp = send(ctx, "3")
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrWaitExceedsDeadline)

	set(func(w http.ResponseWriter) { w.WriteHeader(201) })
	resp = send(context.Background(), "4")
	assert.NoError(t, idemretry.GiveUpReason(resp))
	assert.NoError(t, idemretry.GiveUpReason(nil))
}

// failDoneFile is a file journal whose Updates to done fail while failDone
// is set (the journal then holds "pending" for an action answered 201).
type failDoneFile struct {
	*filejournal.Journal
	failDone atomic.Bool
}

func (f *failDoneFile) Update(ctx context.Context, rec journal.Record) error {
	if f.failDone.Load() && rec.State == journal.StateDone {
		return errDiskGone
	}
	return f.Journal.Update(ctx, rec)
}

func openFailDone(t *testing.T, hashed bool) *failDoneFile {
	t.Helper()
	var fo []filejournal.Option
	if hashed {
		fo = append(fo, filejournal.WithHashedIDs())
	}
	fj, err := filejournal.Open(t.TempDir(), fo...)
	require.NoError(t, err)
	t.Cleanup(func() { fj.Close() })
	return &failDoneFile{Journal: fj}
}

// Guarantee 6: an outcome held in memory is written before the action is
// reserved again, and the request is refused, with nothing sent, while it
// cannot be. Resume of a named action on a journal that hashes ids names it
// by its digest; a live request names it by its id. The two share a flight
// (flights compare digests), but not the table of unlanded outcomes.
func TestHeldOutcomeOfResumeBlocksLiveRequest(t *testing.T) {
	t.Parallel()
	for _, hashed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hashed"}[hashed], func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(status(503)) // the first attempt: a 503, given up (no retries)
			j := openFailDone(t, hashed)
			tr := transportOver(t, j, idemretry.WithMaxRetries(0))
			ctx := idemretry.WithAction(context.Background(), "order-1")
			resp := roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":1}`))
			require.Equal(t, 503, resp.StatusCode) // pending, under its key

			j.failDone.Store(true) // the journal cannot record done from now on
			app := &appResumer{url: srv.URL, orders: map[string]string{}}
			recs, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Len(t, recs, 1)
			app.orders[recs[0].ActionID] = `{"amount":1}`
			res, err := tr.Resume(context.Background(), app, 1)
			require.NoError(t, err)
			require.Len(t, res, 1)
			require.True(t, res[0].Sent)
			require.Equal(t, 201, res[0].Status, "%v", res[0].Err) // charged; its done is held in memory only
			require.Len(t, srv.seen(), 2)

			// The same action, live, while the journal still cannot take
			// the held outcome: refused, nothing sent.
			err = sendErr(tr, post(t, ctx, srv.URL, `{"amount":1}`))
			require.ErrorIs(t, err, errDiskGone, "the held outcome was not written first")
			require.Len(t, srv.seen(), 2, "sent while its outcome (done) is held only in memory")

			// The journal heals: the held done lands first, and the resend
			// is answered under the old key (a replay, no new charge).
			j.failDone.Store(false)
			roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":1}`))
			require.Equal(t, 1, srv.chargeCount())
			un, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Empty(t, un, "the held done did not land")
		})
	}
}

// The other way round: a live request's done is held; Resume, which names
// the action by its digest on a hashing journal, must not send it, however
// the live request was named: a caller key, WithAction, or nothing (the
// default: by its fingerprint).
func TestHeldOutcomeOfLiveRequestBlocksResume(t *testing.T) {
	t.Parallel()
	for _, hashed := range []bool{false, true} {
		for _, kind := range []string{"caller key", "WithAction", "unnamed"} {
			t.Run(fmt.Sprintf("%s/%s", map[bool]string{false: "plain", true: "hashed"}[hashed], kind), func(t *testing.T) {
				testHeldOutcomeOfLiveRequestBlocksResume(t, hashed, kind)
			})
		}
	}
}

func testHeldOutcomeOfLiveRequestBlocksResume(t *testing.T, hashed bool, kind string) {
	srv := newPayServer(t)
	j := openFailDone(t, hashed)
	tr := transportOver(t, j)
	j.failDone.Store(true)
	ctx := context.Background()
	if kind == "WithAction" {
		ctx = idemretry.WithAction(ctx, "order-2")
	}
	req := post(t, ctx, srv.URL, `{"amount":2}`)
	if kind == "caller key" {
		req.Header.Set("Idempotency-Key", "order-2-key")
	}
	resp := roundTrip(t, tr, req)
	require.Equal(t, 201, resp.StatusCode) // done, held in memory; the journal says pending

	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	app := &appResumer{url: srv.URL, orders: map[string]string{recs[0].ActionID: `{"amount":2}`}}
	res, err := tr.Resume(context.Background(), app, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, errDiskGone, "Resume did not write the held outcome first")
	require.Len(t, srv.seen(), 1, "Resume sent an action whose outcome (done) is held only in memory")
}

// hangDoneJournal is a Memory journal whose first Update to done hangs
// until its context ends, and says on entered that it has begun.
type hangDoneJournal struct {
	*journal.Memory
	entered chan struct{}
	hung    atomic.Bool
}

func (h *hangDoneJournal) Update(ctx context.Context, rec journal.Record) error {
	if rec.State == journal.StateDone && h.hung.CompareAndSwap(false, true) {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Memory.Update(ctx, rec)
}

// README guarantee 5: only the write of the outcome being returned may
// outlast the caller's context, by at most OutcomeGrace. A caller whose
// context has no deadline and is cancelled while that write hangs gets
// RoundTrip back within OutcomeGrace of the cancel (here: well within the
// journal timeout of 20 s), and the outcome is kept and landed at Close.
func TestOutcomeWriteOutlastsACancelByOutcomeGraceAtMost(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	j := &hangDoneJournal{Memory: journal.NewMemory(), entered: make(chan struct{}, 1)}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(20*time.Second))
	ctx, cancel := context.WithCancel(idemretry.WithAction(context.Background(), "pay:cancel-during-outcome"))
	defer cancel()
	cancelledAt := make(chan time.Time, 1)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-j.entered:
			cancelledAt <- time.Now()
			cancel()
		case <-finished:
		}
	}()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":5}`))
	returned := time.Now()
	if err == nil {
		resp.Body.Close()
	}
	var cancelled time.Time
	select {
	case cancelled = <-cancelledAt:
	default:
		t.Fatalf("RoundTrip returned (%v) before the outcome write began", err)
	}
	late := returned.Sub(cancelled)
	require.Less(t, late, 5*time.Second, "RoundTrip returned %v after its context was cancelled during the outcome write (OutcomeGrace %v)",
		late, idemretry.OutcomeGrace)
	require.Equal(t, 1, srv.chargeCount())
	require.NoError(t, tr.Close(), "Close lands the outcome the journal did not take in time")
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Empty(t, un)
}

// hW1's review: what the caller is told against what the journal records,
// on the default path (unnamed requests, the file journal), when the
// caller's deadline, cancel or http.Client.Timeout lands anywhere around
// the server's answer. A caller told "pending" (an error, or a give-up)
// must find the same key on its next identical request; a caller given a
// final answer must find a new one (a deliberate repeat is a new payment).

// deadlineLedger is the shared payment server (internal/paytest: a key is
// charged once; a repeat replays; a repeat while the charge runs is 409)
// whose charges take a random few milliseconds, so that answers land
// around the clients' deadlines: one in 8 then fails with 503 (nothing
// stored, the key released), and one in 4 answers with a body that
// arrives across the deadline.
type deadlineLedger struct {
	*paytest.Server
	mu   sync.Mutex
	rnd  *rand.Rand
	plan map[int]chargePlan // by request number
}

// chargePlan is what a charge was drawn to do.
type chargePlan struct {
	fail, slowBody bool
}

func newDeadlineLedger(seed uint64) *deadlineLedger {
	l := &deadlineLedger{rnd: rand.New(rand.NewPCG(seed, 7)), plan: map[int]chargePlan{}}
	l.Server = paytest.New(
		paytest.WithAnswerBody(func(c paytest.Charge) []byte { return []byte(`{"charge":"` + c.ID + `"}`) }),
		paytest.WithProcessing(func(n int, _ *http.Request) {
			l.mu.Lock()
			delay := time.Duration(l.rnd.IntN(25)) * time.Millisecond
			l.plan[n] = chargePlan{fail: l.rnd.IntN(8) == 0, slowBody: l.rnd.IntN(4) == 0}
			l.mu.Unlock()
			time.Sleep(delay)
		}),
		paytest.WithFailure(func(n int, _ *http.Request) (int, bool) {
			return http.StatusServiceUnavailable, l.planOf(n).fail // not processed: nothing stored
		}),
		paytest.WithAfterCharge(func(n int, w http.ResponseWriter, _ *http.Request) bool {
			if !l.planOf(n).slowBody {
				return false
			}
			// The body arrives across the deadline.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"charge":`)
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
			io.WriteString(w, `"`+l.Requests()[n-1].Charge+`"}`)
			return true
		}))
	return l
}

func (l *deadlineLedger) planOf(n int) chargePlan {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.plan[n]
}

// chargesPerKey counts the charges made under each key.
func chargesPerKey(charges []paytest.Charge) map[string]int {
	out := map[string]int{}
	for _, c := range charges {
		out[c.Key]++
	}
	return out
}

// keyOfAnswer returns the key an outcome carried: the response's request's
// header, or the ActionError's key; "" when neither says.
func keyOfAnswer(resp *http.Response, err error) string {
	if resp != nil && resp.Request != nil {
		return resp.Request.Header.Get("Idempotency-Key")
	}
	var ae *idemretry.ActionError
	if errors.As(err, &ae) {
		return ae.Key
	}
	return ""
}

// Found in review hw1 (03eab9b; was TestHW1WhatTheCallerIsToldIsWhatTheNextTapFinds).
func TestOutcomeToldIsWhatTheNextTapFinds(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ledger := newDeadlineLedger(seed)
	srv := newServer(t, ledger.ServeHTTP)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithBackOff(constant(5*time.Millisecond)), idemretry.WithRetryBudget(0, 0))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	client := &http.Client{Transport: tr}

	const payers, rounds = 4, 30
	var nPending, nFinal atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, payers)
	for p := range payers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(p)))
			body := fmt.Sprintf(`{"payer":%d,"amount":100}`, p)
			var (
				prevKey     string
				prevPending bool
				prevWhat    string
			)
			for i := range rounds {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				c := client
				mode := rnd.IntN(4)
				d := time.Duration(1+rnd.IntN(35)) * time.Millisecond
				switch mode {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, d)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					stop := time.AfterFunc(d, cancel)
					defer stop.Stop()
				case 2:
					c = &http.Client{Transport: tr, Timeout: d}
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(body))
				resp, err := c.Do(req)
				key := keyOfAnswer(resp, err)
				pending := true
				what := fmt.Sprintf("round %d mode %d after %v: ", i, mode, d)
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					reason := idemretry.GiveUpReason(resp)
					pending = reason != nil
					what += fmt.Sprintf("%d (give-up %v)", resp.StatusCode, reason)
				} else {
					what += fmt.Sprintf("error %v", err)
				}
				cancel()
				if key != "" && prevKey != "" {
					switch {
					case prevPending && key != prevKey:
						errs <- fmt.Errorf("payer %d: %s left the action pending under %s, yet %s carried %s", p, prevWhat, prevKey, what, key)
						return
					case !prevPending && key == prevKey:
						errs <- fmt.Errorf("payer %d: %s was final under %s, yet the deliberate repeat %s carried it again", p, prevWhat, prevKey, what)
						return
					}
				}
				if key != "" {
					prevKey, prevPending, prevWhat = key, pending, what
					if pending {
						nPending.Add(1)
					} else {
						nFinal.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	t.Logf("%d outcomes final, %d pending", nFinal.Load(), nPending.Load())
	for err := range errs {
		t.Error(err)
	}
	for k, n := range chargesPerKey(ledger.Charges()) {
		if n > 1 {
			t.Errorf("key %s charged %d times", k, n)
		}
	}
}
