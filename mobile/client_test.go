package idemretry_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	root "github.com/idemretry/idemretry"
	idemretry "github.com/idemretry/idemretry/mobile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open returns a Client on a new journal directory, closed at the end of
// the test, and the directory.
func open(t *testing.T, opts *idemretry.Options) (*idemretry.Client, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "idemretry")
	c, err := idemretry.NewClient(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, dir
}

// payment returns a POST of amount to srv's /charges, named actionID.
func payment(srv *payServer, actionID, amount string) *idemretry.Request {
	r := idemretry.NewRequest("POST", srv.URL+"/charges")
	r.Headers.Set("Content-Type", "application/json")
	r.Body = []byte(`{"amount":` + amount + `}`)
	r.ActionID = actionID
	return r
}

// kindOf returns err's kind, failing the test if err is nil.
func kindOf(t *testing.T, err error) int32 {
	t.Helper()
	require.Error(t, err)
	return idemretry.ErrorKind(err)
}

func TestSendPaysOnceAndReplays(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)

	req := payment(srv, "pay:order-1", "1000")
	req.Headers.Set("Authorization", "Bearer sk_test")
	resp, err := c.Send(req)
	require.NoError(t, err)
	assert.EqualValues(t, 200, resp.Status)
	assert.Equal(t, `{"charge":"ch_1"}`, string(resp.Body))
	assert.False(t, resp.Replayed)
	assert.Equal(t, "application/json", resp.Headers.Get("content-type"))
	// Headers are listed sorted by name, each name's values in order.
	var lines []string
	for i := int32(0); i < resp.Headers.Len(); i++ {
		lines = append(lines, resp.Headers.Name(i)+": "+resp.Headers.Value(i))
	}
	assert.Contains(t, strings.Join(lines, "\n"), "X-Multi: b\nX-Multi: a")

	// The same action again: the same key, the server's replay.
	resp2, err := c.Send(payment(srv, "pay:order-1", "1000"))
	require.NoError(t, err)
	assert.True(t, resp2.Replayed)
	assert.Equal(t, resp.Body, resp2.Body)

	reqs, charges := srv.snapshot()
	require.Len(t, reqs, 2)
	assert.NotEmpty(t, reqs[0].Key)
	assert.Equal(t, reqs[0].Key, reqs[1].Key)
	assert.Equal(t, "Bearer sk_test", reqs[0].Header.Get("Authorization"))
	assert.Equal(t, `{"amount":1000}`, reqs[0].Body)
	assert.Equal(t, map[string]int{reqs[0].Key: 1}, charges)

	// A GET needs no action and carries no key.
	resp3, err := c.Send(idemretry.NewRequest("GET", srv.URL+"/ping"))
	require.NoError(t, err)
	assert.Equal(t, "pong", string(resp3.Body))
	reqs, _ = srv.snapshot()
	assert.Empty(t, reqs[2].Key)

	l, err := c.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len())
}

// The app may reuse its body array after Send; the request sent, and every
// retry of it, is what Send was given.
func TestSendCopiesBody(t *testing.T) {
	srv := newPayServer(t)
	var once sync.Once
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		handled := false
		once.Do(func() { handled = cutConnection(w, r) })
		return handled
	})
	c, _ := open(t, nil)
	req := payment(srv, "pay:order-copy", "1000")
	body := req.Body
	resp, err := c.Send(req)
	require.NoError(t, err)
	copy(body, "XXXXXXXXX")
	assert.EqualValues(t, 200, resp.Status)
	reqs, _ := srv.snapshot()
	require.Len(t, reqs, 2) // the cut attempt and its retry
	assert.Equal(t, `{"amount":1000}`, reqs[1].Body)
	assert.Equal(t, reqs[0].Key, reqs[1].Key)
}

// A Kotlin or Swift developer may write "post": it must still be a POST,
// sent with the action's key, not an unknown method sent once without one.
func TestLowerCaseMethodIsKeyed(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)
	req := payment(srv, "pay:lower", "100")
	req.Method = "post"
	resp, err := c.Send(req)
	require.NoError(t, err)
	assert.EqualValues(t, 200, resp.Status)
	reqs, charges := srv.snapshot()
	require.Len(t, reqs, 1)
	assert.NotEmpty(t, reqs[0].Key, "a lower-case post was sent without a key")
	assert.Len(t, charges, 1)
}

func TestConcurrentSendsOfOneActionPayOnce(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)
	var wg sync.WaitGroup
	results := make([]*idemretry.Response, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.Send(payment(srv, "pay:double-tap", "500"))
		}()
	}
	wg.Wait()
	for i := range results {
		require.NoError(t, errs[i])
		assert.EqualValues(t, 200, results[i].Status)
	}
	_, charges := srv.snapshot()
	require.Len(t, charges, 1)
	for _, n := range charges {
		assert.Equal(t, 1, n)
	}
}

func TestHeaders(t *testing.T) {
	h := idemretry.NewHeaders()
	h.Set("X-A", "1")
	h.Add("x-a", "2")
	h.Add("X-B", "3")
	assert.EqualValues(t, 3, h.Len())
	assert.Equal(t, "1", h.Get("X-a"))
	assert.True(t, h.Has("x-b"))
	h.Set("X-A", "9")
	assert.EqualValues(t, 2, h.Len())
	assert.Equal(t, "X-B", h.Name(0))
	assert.Equal(t, "X-A", h.Name(1))
	assert.Equal(t, "9", h.Value(1))
	assert.Equal(t, "", h.Name(2))
	assert.Equal(t, "", h.Value(-1))
	h.Remove("X-B")
	assert.EqualValues(t, 1, h.Len())
	assert.False(t, h.Has("X-B"))

	var zero idemretry.Headers // what a Java "new Headers()" of the zero value would be
	assert.Equal(t, "", zero.Get("A"))
	zero.Set("A", "b")
	assert.Equal(t, "b", zero.Get("a"))
}

func TestErrorKindOfForeignAndNil(t *testing.T) {
	assert.Equal(t, idemretry.KindNone, idemretry.ErrorKind(nil))
	assert.Nil(t, idemretry.FailureOf(nil))
	assert.Equal(t, idemretry.KindOther, idemretry.ErrorKind(errors.New("app's own")))
	assert.Equal(t, "app's own", idemretry.FailureOf(errors.New("app's own")).Message)
}

func TestKindInvalidRequest(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)
	header := payment(srv, "pay:h", "1")
	header.Headers.Set("Bad Name", "x")
	value := payment(srv, "pay:v", "1")
	value.Headers.Set("X-Evil", "a\r\nInjected: 1")
	timeout := payment(srv, "pay:t", "1")
	timeout.TimeoutMillis = -1
	cases := map[string]*idemretry.Request{
		"null":            nil,
		"no method":       {URL: srv.URL, ActionID: "pay:m"},
		"bad method":      {Method: "PO ST", URL: srv.URL, ActionID: "pay:m"},
		"not http":        {Method: "POST", URL: "ftp://example.com/x", ActionID: "pay:u"},
		"no host":         {Method: "POST", URL: "http:///charges", ActionID: "pay:u"},
		"relative":        {Method: "POST", URL: "/charges", ActionID: "pay:u"},
		"header name":     header,
		"header value":    value,
		"timeout":         timeout,
		"no action":       payment(srv, "", "1"),
		"reserved prefix": payment(srv, "key:abc", "1"),
		"action too long": payment(srv, strings.Repeat("a", 2000), "1"),
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := c.Send(req)
			assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
			f := idemretry.FailureOf(err)
			assert.False(t, f.MaybeProcessed)
			assert.True(t, strings.HasPrefix(f.Message, "idemretry: "), f.Message)
			assert.False(t, strings.HasPrefix(f.Message, "idemretry: idemretry: "), f.Message)
		})
	}
	assert.Equal(t, 0, srv.requestCount(), "an invalid request reached the server")
	l, err := c.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len())
}

func TestNewClientRefusesBadArguments(t *testing.T) {
	for name, tc := range map[string]struct {
		dir  string
		opts *idemretry.Options
	}{
		"empty dir":         {"", nil},
		"relative dir":      {"idemretry", nil},
		"negative window":   {t.TempDir(), &idemretry.Options{KeyWindowMillis: -1}},
		"negative timeout":  {t.TempDir(), &idemretry.Options{TimeoutMillis: -5}},
		"negative defaults": {t.TempDir(), &idemretry.Options{KeyWindowMillis: -1, TimeoutMillis: -1}},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := idemretry.NewClient(tc.dir, tc.opts)
			assert.Nil(t, c)
			assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err))
			assert.ErrorIs(t, err, root.ErrInvalidOption)
		})
	}
}

func TestNewOptionsAreTheDefaults(t *testing.T) {
	o := idemretry.NewOptions()
	assert.Equal(t, int64(24*time.Hour/time.Millisecond), o.KeyWindowMillis)
	assert.Equal(t, idemretry.DefaultTimeoutMillis, o.TimeoutMillis)
}

// Nothing listens: no attempt can have reached a server.
func TestKindNetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	c, _ := open(t, nil)
	req := &idemretry.Request{Method: "POST", URL: "http://" + addr + "/charges", Body: []byte("{}"), ActionID: "pay:offline", TimeoutMillis: 1500}
	start := time.Now()
	_, err = c.Send(req)
	assert.Equal(t, idemretry.KindNetwork, kindOf(t, err), "%v", err)
	assert.Less(t, time.Since(start), 10*time.Second)
	f := idemretry.FailureOf(err)
	assert.False(t, f.MaybeProcessed)
	assert.Equal(t, "pay:offline", f.ActionID)
	assert.NotEmpty(t, f.Key)
	assert.GreaterOrEqual(t, f.Attempts, int32(1))

	// Still pending, with its key, to resend when the network is back.
	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len())
	assert.Equal(t, "pay:offline", l.Get(0).ActionID)
	assert.Equal(t, f.Key, l.Get(0).Key)
	assert.False(t, l.Get(0).OutcomeUnknown)
	assert.Nil(t, l.Get(1))
}

// The server commits the charge and never answers within the timeout: the
// app must learn that it may have paid, and the resend must be the same
// payment.
func TestKindMaybeProcessed(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, _ := open(t, nil)
	req := payment(srv, "pay:slow", "700")
	req.TimeoutMillis = 1500
	_, err := c.Send(req)
	assert.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed)
	assert.Equal(t, "pay:slow", f.ActionID)
	assert.NotEmpty(t, f.Key)

	srv.setAfterCommit(nil)
	resp, err := c.Send(payment(srv, "pay:slow", "700"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	reqs, charges := srv.snapshot()
	assert.Equal(t, map[string]int{f.Key: 1}, charges)
	for _, r := range reqs {
		assert.Equal(t, f.Key, r.Key)
	}
}

// A body cut after the final answer's headers: the payment was made and
// recorded; the app is told it may have paid, and the resend is answered
// with the replay.
func TestKindMaybeProcessedWhenTheBodyIsCut(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"charge":`))
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return true
	})
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:cut-body", "900"))
	assert.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed)
	assert.EqualValues(t, 200, f.Status)

	srv.setAfterCommit(nil)
	resp, err := c.Send(payment(srv, "pay:cut-body", "900"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges := srv.snapshot()
	assert.Len(t, charges, 1)
}

// The server asks to be called back in an hour: the retries stop at once,
// the action stays pending with its key, and a later send completes it.
func TestKindGaveUp(t *testing.T) {
	srv := newPayServer(t)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Retry-After", "3600")
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return true
	})
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:busy", "300"))
	assert.Equal(t, idemretry.KindGaveUp, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.EqualValues(t, 503, f.Status)
	assert.True(t, f.MaybeProcessed)
	assert.ErrorIs(t, err, root.ErrRetryAfterTooLong)
	assert.Equal(t, `idemretry: action "pay:busy": gave up: Retry-After beyond the cap, last status 503`, f.Message)
	reqs, _ := srv.snapshot()
	require.Len(t, reqs, 1)
	assert.Equal(t, reqs[0].Key, f.Key)

	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len())
	assert.Equal(t, f.Key, l.Get(0).Key)

	srv.setBefore(nil)
	resp, err := c.Send(payment(srv, "pay:busy", "300"))
	require.NoError(t, err)
	assert.EqualValues(t, 200, resp.Status)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{f.Key: 1}, charges)
}

func TestKindFingerprintMismatch(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:order-9", "100"))
	require.NoError(t, err)
	_, err = c.Send(payment(srv, "pay:order-9", "99999"))
	assert.Equal(t, idemretry.KindFingerprintMismatch, kindOf(t, err), "%v", err)
	// The action (its first payload) was performed.
	assert.True(t, idemretry.FailureOf(err).MaybeProcessed)
	assert.Equal(t, 1, srv.requestCount(), "the other payload was sent")
}

// A key older than the window is never sent again: the action is outcome
// unknown, for the app to reconcile and Forget.
func TestKindWindowExpired(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	const window = 2500 * time.Millisecond
	c, _ := open(t, &idemretry.Options{KeyWindowMillis: window.Milliseconds()})
	start := time.Now()
	req := payment(srv, "pay:old", "100")
	req.TimeoutMillis = 1000
	_, err := c.Send(req)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	key := idemretry.FailureOf(err).Key
	require.Equal(t, key, <-srv.committed)
	time.Sleep(time.Until(start.Add(window + 100*time.Millisecond)))
	srv.setAfterCommit(nil)
	sent := srv.requestCount()

	_, err = c.Send(payment(srv, "pay:old", "100"))
	assert.Equal(t, idemretry.KindWindowExpired, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed)
	assert.Equal(t, key, f.Key)
	assert.Equal(t, sent, srv.requestCount(), "an expired key was sent")

	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len())
	assert.True(t, l.Get(0).OutcomeUnknown)

	// Resume does not send it either; it says why.
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		t.Errorf("Rebuild(%q) called for an action whose outcome is unknown", id)
		return nil, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	assert.True(t, out.Get(0).Skipped)
	assert.Equal(t, idemretry.KindWindowExpired, out.Get(0).Failure.Kind)
	assert.Equal(t, sent, srv.requestCount())

	// Reconciled: Forget it, and the next send is a new action.
	require.NoError(t, c.Forget("pay:old"))
	resp, err := c.Send(payment(srv, "pay:old", "100"))
	require.NoError(t, err)
	assert.False(t, resp.Replayed)
	reqs, _ := srv.snapshot()
	assert.NotEqual(t, key, reqs[len(reqs)-1].Key)
}

// Another Client holds the directory; then the directory is removed under
// an open Client. Nothing is sent in either case.
func TestKindJournal(t *testing.T) {
	srv := newPayServer(t)
	c, dir := open(t, nil)
	c2, err := idemretry.NewClient(dir, nil)
	assert.Nil(t, c2)
	assert.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	assert.True(t, strings.HasPrefix(err.Error(), "idemretry: "), "%v", err)
	assert.NotContains(t, err.Error(), ": idemretry: ", "a second prefix")

	require.NoError(t, os.RemoveAll(dir))
	_, err = c.Send(payment(srv, "pay:gone", "1"))
	assert.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	assert.False(t, idemretry.FailureOf(err).MaybeProcessed)
	assert.Equal(t, 0, srv.requestCount())
}

func TestKindClosed(t *testing.T) {
	srv := newPayServer(t)
	c, _ := open(t, nil)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "a second Close")

	_, err := c.Send(payment(srv, "pay:late", "1"))
	assert.Equal(t, idemretry.KindClosed, kindOf(t, err))
	assert.Equal(t, idemretry.KindClosed, kindOf(t, c.Sync()))
	assert.Equal(t, idemretry.KindClosed, kindOf(t, c.Forget("pay:late")))
	_, err = c.Unfinished()
	assert.Equal(t, idemretry.KindClosed, kindOf(t, err))
	_, err = c.Resume(rebuildWith(func(string) (*idemretry.Request, error) { return nil, nil }))
	assert.Equal(t, idemretry.KindClosed, kindOf(t, err))
	assert.Equal(t, 0, srv.requestCount())
}

// Close ends a Send in progress promptly; its action stays pending with its
// key, and the next Client resumes it.
func TestCloseEndsSendsInProgress(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	dir := filepath.Join(t.TempDir(), "idemretry")
	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := c.Send(payment(srv, "pay:closing", "100"))
		done <- err
	}()
	key := <-srv.committed
	start := time.Now()
	require.NoError(t, c.Close())
	err = <-done
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)

	srv.setAfterCommit(nil)
	c2, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c2.Close()
	out, err := c2.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		return payment(srv, "", "100"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	require.NotNil(t, out.Get(0).Response, "%+v", out.Get(0).Failure)
	assert.True(t, out.Get(0).Response.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// rebuildWith adapts a function to Rebuilder.
type rebuildWith func(actionID string) (*idemretry.Request, error)

func (f rebuildWith) Rebuild(actionID string) (*idemretry.Request, error) { return f(actionID) }

func TestResumeOutcomes(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, _ := open(t, nil)
	var wg sync.WaitGroup
	for _, id := range []string{"pay:a", "pay:b", "pay:c", "pay:d"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := payment(srv, id, "1")
			req.TimeoutMillis = 1500
			_, err := c.Send(req)
			assert.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
		}()
	}
	wg.Wait()
	require.Len(t, srv.committed, 4, "every payment reached the server")
	srv.setAfterCommit(nil)
	_, err := c.Resume(nil)
	assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err))

	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		switch id {
		case "pay:a":
			r := payment(srv, "", "1") // the id is filled in
			r.Headers = nil
			return r, nil
		case "pay:b":
			return nil, errors.New("order b is gone")
		case "pay:c":
			return nil, nil // not now
		default:
			return payment(srv, "pay:other", "1"), nil // names another action
		}
	}))
	require.NoError(t, err)
	require.EqualValues(t, 4, out.Len())
	byID := map[string]*idemretry.Outcome{}
	for i := int32(0); i < out.Len(); i++ {
		byID[out.Get(i).ActionID] = out.Get(i)
	}
	a, b, cc, d := byID["pay:a"], byID["pay:b"], byID["pay:c"], byID["pay:d"]
	require.NotNil(t, a.Response)
	assert.True(t, a.Response.Replayed)
	assert.True(t, b.Skipped)
	assert.Equal(t, idemretry.KindOther, b.Failure.Kind)
	assert.Equal(t, "order b is gone", b.Failure.Message)
	assert.True(t, cc.Skipped)
	assert.Nil(t, cc.Failure)
	assert.Nil(t, cc.Response)
	assert.Nil(t, d.Response)
	assert.Equal(t, idemretry.KindInvalidRequest, d.Failure.Kind)

	l, err := c.Unfinished()
	require.NoError(t, err)
	var left []string
	for i := int32(0); i < l.Len(); i++ {
		left = append(left, l.Get(i).ActionID)
	}
	assert.ElementsMatch(t, []string{"pay:b", "pay:c", "pay:d"}, left)
	_, charges := srv.snapshot()
	for k, n := range charges {
		assert.Equal(t, 1, n, "key %s charged %d times", k, n)
	}
}

// A key the server refuses as used for another payload ends the action as
// outcome-unknown: KindOutcomeUnknown, and a resend is refused the same way
// with nothing sent.
func TestKindOutcomeUnknown(t *testing.T) {
	srv := newPayServer(t)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, `{"title":"Idempotency-Key is already used"}`)
		return true
	})
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:reused", "300"))
	assert.Equal(t, idemretry.KindOutcomeUnknown, kindOf(t, err), "%v", err)
	assert.ErrorIs(t, err, root.ErrKeyReused)
	_, err = c.Send(payment(srv, "pay:reused", "300"))
	assert.Equal(t, idemretry.KindOutcomeUnknown, kindOf(t, err), "%v", err)
	reqs, _ := srv.snapshot()
	assert.Len(t, reqs, 1, "nothing more is sent")
}
