package idemretry_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
)

// rtFunc adapts a function to http.RoundTripper.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func resp(code int, req *http.Request) *http.Response {
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("x")), Request: req}
}

// I3: a 503 whose context ended as it arrived is not a definitive answer: the
// action stays pending, and a fingerprint-identified resend keeps its key.
func TestRetryableStatusAfterCancelStaysPending(t *testing.T) {
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
	j := journal.NewMemory()
	clk := newFakeClock()
	// What a process killed during its first attempt leaves behind: the
	// durable reservation, with the attempt count never updated.
	_, _, err := j.Reserve(context.Background(), journal.Record{
		ActionID: "pay:crashed", Key: "0b9f2f5e-8a7a-4d6e-9c43-2d1a5c7e8f90",
		Fingerprint: fpOf(t, "http://pay.example/v1/charges", "x"), CreatedAt: clk.Now(), State: journal.StatePending,
	}, journal.ReuseAny)
	require.NoError(t, err)

	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		return nil, dialErr
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(clk), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	req, _ := http.NewRequestWithContext(idemretry.WithAction(context.Background(), "pay:crashed"),
		http.MethodPost, "http://pay.example/v1/charges", strings.NewReader("x"))
	_, err = tr.RoundTrip(req)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.True(t, ae.MaybeProcessed, "the previous run's attempt may have reached the server: %v", err)

	// The same after the key window: ErrKeyWindowExpired with MaybeProcessed false.
	_, _, err = j.Reserve(context.Background(), journal.Record{
		ActionID: "pay:crashed2", Key: "1b9f2f5e-8a7a-4d6e-9c43-2d1a5c7e8f90",
		Fingerprint: fpOf(t, "http://pay.example/v1/charges", "x"), CreatedAt: clk.Now(), State: journal.StatePending,
	}, journal.ReuseAny)
	require.NoError(t, err)
	clk.Advance(25 * time.Hour)
	req, _ = http.NewRequestWithContext(idemretry.WithAction(context.Background(), "pay:crashed2"),
		http.MethodPost, "http://pay.example/v1/charges", strings.NewReader("x"))
	_, err = tr.RoundTrip(req)
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
	r, err := tr.RoundTrip(req)
	require.NoError(t, err)
	r.Body.Close()
	rec, _, err := j.Reserve(context.Background(), journal.Record{ActionID: "a"}, journal.ReuseAny)
	require.NoError(t, err)
	return rec.Fingerprint
}

// http.Client follows a 307/308 for a POST by sending the same body, with
// the same context, to the new URL. That hop is a sub-action with a key of
// its own, stable across repeats: a resend of the whole action reuses both.
func TestRedirectHopIsSubAction(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t)
	c := &http.Client{Transport: tr}
	for range 2 {
		req := post(t, idemretry.WithAction(context.Background(), "pay:redirect"), srv.URL+"/old", "x")
		r, err := c.Do(req)
		require.NoError(t, err)
		readAll(t, r)
		assert.Equal(t, http.StatusCreated, r.StatusCode)
	}
	keys := keysOf(srv.seen())
	require.Len(t, keys, 4)
	assert.NotEqual(t, keys[0], keys[1], "the hop has its own key")
	assert.Equal(t, keys[:2], keys[2:], "and both keys are stable")
	assert.NotEmpty(t, keys[1])
	assert.Equal(t, 1, srv.chargeCount())
}

// I8 for caller keys: the key names the action, whatever WithAction says, so
// a key already used for one payload refuses another before sending.
func TestCallerKeyNamesTheAction(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	var errs []error
	for i, a := range []string{"pay:A", "pay:B"} {
		req := post(t, idemretry.WithAction(context.Background(), a), srv.URL, []string{"amount=1", "amount=999"}[i])
		req.Header.Set("Idempotency-Key", "order-42")
		r, err := tr.RoundTrip(req)
		if err == nil {
			r.Body.Close()
		}
		errs = append(errs, err)
	}
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], idemretry.ErrFingerprintMismatch)
	assert.Len(t, srv.seen(), 1, "the second payload was not sent")
}

// WithAction ids that are empty or look like derived ids are refused.
func TestInvalidActionIDs(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	for _, id := range []string{"", "key:order-1", "fp:abc"} {
		_, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), id), srv.URL, "x"))
		assert.ErrorIs(t, err, idemretry.ErrInvalidAction, "%q", id)
	}
	assert.Empty(t, srv.seen())
}

// A method that carries no key and is not idempotent by definition is sent
// once: retrying it without a key could perform it twice.
func TestUnkeyedUnsafeMethodSentOnce(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithKeyedMethods(http.MethodPatch))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, []string{""}, keysOf(srv.seen()))

	req, err := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	resp, err = tr.RoundTrip(req)
	require.NoError(t, err)
	readAll(t, resp)
	assert.Len(t, srv.seen(), 1+idemretry.DefaultMaxRetries+1, "PUT is idempotent: retried")
}

// A base RoundTripper that breaks the contract by returning a response and
// an error: the error wins and the response body is closed.
func TestBaseReturningBothIsClosed(t *testing.T) {
	body := &closeTracker{Reader: strings.NewReader("x")}
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: body}, errors.New("broken base")
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()),
		idemretry.WithClock(newFakeClock()), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(post(t, context.Background(), "http://pay.example/", "x"))
	assert.Nil(t, resp)
	assert.Error(t, err)
	assert.True(t, body.isClosed())
}

// A done action stays done when a later resend of it fails: its outcome is
// known, and it must not turn up among the unfinished actions.
func TestDoneActionStaysDoneAfterFailedResend(t *testing.T) {
	srv := newPayServer(t)
	tr, j, _ := newTestTransport(t, idemretry.WithMaxRetries(1))
	ctx := idemretry.WithAction(context.Background(), "pay:done-then-down")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)

	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { hijackAndClose(w); return true }
	_, err = tr.RoundTrip(post(t, ctx, srv.URL, "x"))
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
	srv := newPayServer(t)
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(&http.Transport{},
		idemretry.WithJournalDir(dir, filejournal.WithFlushInterval(time.Hour)))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)

	// kill -9 now: what is on disk is the journal file as it is.
	img := t.TempDir()
	data, err := os.ReadFile(filepath.Join(dir, "journal"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(img, "journal"), data, 0o600))
	require.NoError(t, tr.Close())

	again, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(img))
	require.NoError(t, err)
	defer again.Close()
	resp, err = again.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":5}`))
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
		r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
		if err == nil {
			r.Body.Close()
		}
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
	var logs bytes.Buffer
	j := syncJournal{journal.NewMemory(), func(context.Context) error { return errors.New("injected EIO") }}
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(newFakeClock()),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)
	r, err := tr.RoundTrip(post(t, context.Background(), "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
	}
	require.True(t, err != nil || bytes.Contains(logs.Bytes(), []byte("EIO")), "sync failure neither returned nor logged; logs: %q", logs.String())
}
