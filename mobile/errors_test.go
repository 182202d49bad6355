package idemretry_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	root "github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	idemretry "github.com/idemretry/idemretry/mobile"
)

func TestErrorKindForeignAndNil(t *testing.T) {
	t.Parallel()
	assert.Equal(t, idemretry.KindNone, idemretry.ErrorKind(nil))
	assert.Nil(t, idemretry.FailureOf(nil))
	assert.Equal(t, idemretry.KindOther, idemretry.ErrorKind(errors.New("app's own")))
	assert.Equal(t, "app's own", idemretry.FailureOf(errors.New("app's own")).Message)
}

func TestKindInvalidRequest(t *testing.T) {
	t.Parallel()
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

// Nothing listens: no attempt can have reached a server.
func TestKindNetwork(t *testing.T) {
	t.Parallel()
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

// A PUT or a DELETE (sent without a key, retried) that cannot connect is
// KindNetwork, as a GET is: nothing was sent. (It was KindMaybeProcessed:
// the Go package's OutcomeOf took http.Client's "Put" for a keyed request
// answered with a redirect.)
func TestKindNetworkForEveryMethod(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	c, _ := open(t, nil)
	for _, method := range []string{"GET", "PUT", "DELETE"} {
		_, err := c.Send(&idemretry.Request{Method: method, URL: "http://" + addr + "/orders/1", TimeoutMillis: 1500})
		assert.Equal(t, idemretry.KindNetwork, kindOf(t, err), "%s: %v", method, err)
		f := idemretry.FailureOf(err)
		assert.False(t, f.MaybeProcessed, method)
		assert.Equal(t, idemretry.OutcomeNotSent, f.Outcome(), method)
	}
}

// The server commits the charge and never answers within the timeout: the
// app must learn that it may have paid, and the resend must be the same
// payment.
func TestKindMaybeProcessed(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	assert.EqualValues(t, 1, f.Attempts)

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

// Failure.Attempts counts the requests of the action sent, as the server
// saw them, whatever the kind: it was 0 after KindGaveUp (4 attempts
// sent) and after a body cut short, and counted a failed redirect's
// attempts to reach its target instead of the payment's. Found in issue 26,
// item 15.
func TestFailureAttemptsCountWhatWasSent(t *testing.T) {
	t.Parallel()
	unavailable := func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	}
	cutBody := func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"charge":`))
		w.(http.Flusher).Flush()
		return cutConnection(w, r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := ln.Addr().String()
	require.NoError(t, ln.Close())
	toGone := func(w http.ResponseWriter, r *http.Request) bool {
		http.Redirect(w, r, "http://"+gone+"/receipts/1", http.StatusSeeOther)
		return true
	}
	for name, tc := range map[string]struct {
		method              string
		before, afterCommit func(w http.ResponseWriter, r *http.Request) bool
		kind                int32
	}{
		"POST, 503 until the timeout": {method: "POST", before: unavailable, kind: idemretry.KindGaveUp},
		"GET, 503 until the timeout":  {method: "GET", before: unavailable, kind: idemretry.KindGaveUp},
		"POST, body cut":              {method: "POST", afterCommit: cutBody, kind: idemretry.KindMaybeProcessed},
		"POST, redirect fails":        {method: "POST", afterCommit: toGone, kind: idemretry.KindMaybeProcessed},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newPayServer(t)
			srv.setBefore(tc.before)
			srv.setAfterCommit(tc.afterCommit)
			c, _ := open(t, nil)
			r := payment(srv, "pay:counted", "100")
			if tc.method == "GET" {
				r = idemretry.NewRequest("GET", srv.URL+"/balance")
			}
			r.TimeoutMillis = 2500
			_, err := c.Send(r)
			require.Equal(t, tc.kind, kindOf(t, err), "%v", err)
			f := idemretry.FailureOf(err)
			reqs, _ := srv.snapshot()
			require.NotEmpty(t, reqs)
			assert.EqualValues(t, len(reqs), f.Attempts, "%d requests reached the server: %s", len(reqs), f.Message)
			if tc.method == "POST" {
				assert.Equal(t, reqs[0].Key, f.Key)
				l, err := c.Unfinished()
				require.NoError(t, err)
				if l.Len() > 0 { // the cut body's action is done
					assert.Equal(t, f.Attempts, l.Get(0).Attempts, "Unfinished and the Failure disagree")
				}
			}
		})
	}
}

// An app's own key goes out as the app wrote it (quoted here), and a
// Failure names it bare, as every Failure names a key: also the one of a
// payment answered with a redirect whose target failed (issue 29, item 6).
func TestFailureKeyOfAnOwnQuotedKeyIsBare(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := ln.Addr().String()
	require.NoError(t, ln.Close())
	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		http.Redirect(w, r, "http://"+gone+"/receipts/1", http.StatusSeeOther)
		return true
	})
	c, _ := open(t, nil)
	r := payment(srv, "", "100")
	r.Headers.Set("Idempotency-Key", `"app-key-1"`)
	r.TimeoutMillis = 2500
	_, err = c.Send(r)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	reqs, _ := srv.snapshot()
	require.NotEmpty(t, reqs)
	assert.Equal(t, `"app-key-1"`, reqs[0].Key, "the app's key, as written")
	assert.Equal(t, "app-key-1", idemretry.FailureOf(err).Key)
}

func TestKindFingerprintMismatch(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:order-9", "100"))
	require.NoError(t, err)
	_, err = c.Send(payment(srv, "pay:order-9", "99999"))
	assert.Equal(t, idemretry.KindFingerprintMismatch, kindOf(t, err), "%v", err)
	// The action (its first payload) was performed.
	assert.True(t, idemretry.FailureOf(err).MaybeProcessed)
	assert.EqualValues(t, 1, idemretry.FailureOf(err).Attempts, "the first payload's")
	assert.Equal(t, 1, srv.requestCount(), "the other payload was sent")
}

// A key older than the window is never sent again: the action is outcome
// unknown, for the app to reconcile and Forget.
func TestKindWindowExpired(t *testing.T) {
	t.Parallel()
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
	assert.EqualValues(t, sent, f.Attempts)
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
	assert.EqualValues(t, sent, out.Get(0).Failure.Attempts)
	assert.Equal(t, sent, srv.requestCount())

	// Reconciled: Forget it, and the next send is a new action.
	require.NoError(t, c.Forget("pay:old"))
	resp, err := c.Send(payment(srv, "pay:old", "100"))
	require.NoError(t, err)
	assert.False(t, resp.Replayed)
	reqs, _ := srv.snapshot()
	assert.NotEqual(t, key, reqs[len(reqs)-1].Key)
}

// A device whose clock ran two days ahead when the key was made, then was
// set right: the key's age cannot be known, so nothing is sent, and the
// app is told why.
func TestKindClockSkew(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	dir := filepath.Join(t.TempDir(), "idemretry")

	tr, err := root.NewTransport(nil, root.WithJournalDir(dir), root.WithClock(aheadClock{48 * time.Hour}))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(root.WithAction(context.Background(), "pay:skewed"), time.Second)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/charges", strings.NewReader(`{"amount":5}`))
	require.NoError(t, err)
	_, err = (&http.Client{Transport: tr}).Do(hreq)
	require.Error(t, err)
	require.NoError(t, tr.Close())
	srv.setAfterCommit(nil)
	sent := srv.requestCount()

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Send(payment(srv, "pay:skewed", "5"))
	assert.Equal(t, idemretry.KindClockSkew, kindOf(t, err), "%v", err)
	assert.Equal(t, sent, srv.requestCount(), "a key from the future was sent")
	assert.EqualValues(t, sent, idemretry.FailureOf(err).Attempts)
	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len(), "the action must be kept")
}

// Another Client holds the directory; then the directory is removed under
// an open Client. Nothing is sent in either case.
func TestKindJournal(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// A key the server refuses as used for another payload ends the action as
// outcome-unknown: KindOutcomeUnknown, and a resend is refused the same way
// with nothing sent.
func TestKindOutcomeUnknown(t *testing.T) {
	t.Parallel()
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
	assert.EqualValues(t, 1, idemretry.FailureOf(err).Attempts)
	_, err = c.Send(payment(srv, "pay:reused", "300"))
	assert.Equal(t, idemretry.KindOutcomeUnknown, kindOf(t, err), "%v", err)
	assert.EqualValues(t, 1, idemretry.FailureOf(err).Attempts, "the one sent before")
	reqs, _ := srv.snapshot()
	assert.Len(t, reqs, 1, "nothing more is sent")
}

// A large payment (its fingerprint keyed under the journal
// directory's fingerprint.key) left maybe-processed; the app restarts and
// fingerprint.key is gone (restored from a backup without it, deleted by a
// cleaner). The resend is refused, nothing sent, until its key window ends.
// Its kind must not tell the app what KindMaybeProcessed tells it, "send
// it again with the same ActionID to get its answer": every resend is
// refused the same way. The journal lost what it needs to check the
// action: KindJournal ("the journal is damaged"), MaybeProcessed true.
//
// Found in review hK2.
func TestKindJournalUncheckableLargePayment(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	dir := filepath.Join(t.TempDir(), "idemretry")
	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	large := func() *idemretry.Request {
		r := payment(srv, "pay:large", "700")
		r.Body = append([]byte(`{"amount":700,"note":"`), append(bytes.Repeat([]byte("x"), 80<<10), `"}`...)...)
		r.TimeoutMillis = 1500
		return r
	}
	_, err = c.Send(large())
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	key := idemretry.FailureOf(err).Key
	require.NoError(t, c.Close())
	srv.setAfterCommit(nil)

	_, err = os.Stat(filepath.Join(dir, "fingerprint.key"))
	require.NoError(t, err, "the journal directory has no fingerprint.key")
	require.NoError(t, os.Remove(filepath.Join(dir, "fingerprint.key")))
	c, err = idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()

	for i := 0; i < 2; i++ { // as KindMaybeProcessed says: send it again
		_, err = c.Send(large())
		if err == nil && i == 0 {
			t.Skip("this CPU makes plain fingerprints: the resend is checked and replayed")
		}
		require.Error(t, err)
		f := idemretry.FailureOf(err)
		t.Logf("send %d: kind %d: %s", i, f.Kind, f.Message)
		mobileWordsOnly(t, f.Message)
		assert.True(t, f.MaybeProcessed)
		assert.Equal(t, key, f.Key)
		assert.EqualValues(t, 1, f.Attempts)
		assert.Equal(t, idemretry.KindJournal, f.Kind, "told to resend what is refused at every resend")
	}
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
	reqs, _ := srv.snapshot()
	assert.Len(t, reqs, 1, "sent again")
}

// A payment ends KindMaybeProcessed after the server charged
// it; then the journal fails (its directory was removed: a new payment
// fails first, and the journal stops). The resend of the first payment
// fails too, nothing sent, with KindJournal, and said MaybeProcessed
// false, "nothing can have reached the server": an app that
// trusts it lets the user pay again under a new action. It may have been
// charged: MaybeProcessed stays true. A new action, that the journal
// never held, still says false.
//
// Found in review hX2.
func TestKindJournalKeepsMaybeProcessed(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	c, dir := open(t, nil)
	key := chargedAnswerLost(t, srv, c, "pay:charged")

	require.NoError(t, os.RemoveAll(dir))
	_, err := c.Send(payment(srv, "pay:new", "100"))
	require.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	assert.False(t, idemretry.FailureOf(err).MaybeProcessed, "a new action")

	_, err = c.Send(payment(srv, "pay:charged", "100"))
	require.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed, "a payment the server charged: %s", f.Message)
	assert.Equal(t, "pay:charged", f.ActionID)
	if f.Key != "" {
		assert.Equal(t, key, f.Key)
	}
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// MaybeProcessed is about the action, whatever refused this
// Send of it. A payment charged by the server (KindMaybeProcessed), sent
// again with a mistake (a negative timeout), or after Close, was refused
// saying MaybeProcessed false, "nothing can have reached the server".
//
// Found in review hX2.
func TestRefusalKeepsMaybeProcessed(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	c, _ := open(t, nil)
	key := chargedAnswerLost(t, srv, c, "pay:charged")

	bad := payment(srv, "pay:charged", "100")
	bad.TimeoutMillis = -1
	_, err := c.Send(bad)
	require.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	f := idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed, f.Message)
	assert.Equal(t, "pay:charged", f.ActionID)
	assert.Equal(t, key, f.Key)
	assert.EqualValues(t, 1, f.Attempts)

	bad = payment(srv, "pay:never", "100")
	bad.TimeoutMillis = -1
	_, err = c.Send(bad)
	require.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	assert.False(t, idemretry.FailureOf(err).MaybeProcessed, "an action never sent")

	require.NoError(t, c.Close())
	_, err = c.Send(payment(srv, "pay:charged", "100"))
	require.Equal(t, idemretry.KindClosed, kindOf(t, err), "%v", err)
	f = idemretry.FailureOf(err)
	assert.True(t, f.MaybeProcessed, "the journal, closed, cannot say")
	assert.Equal(t, "pay:charged", f.ActionID)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// Error messages quote the app's strings cut to 64 bytes;
// cut inside a character, the message was not valid UTF-8, and neither is
// a response header's value in Latin-1 (HTTP allows it): gobind's
// Objective-C side makes no NSString of such bytes (the app reads "")
// where its Java side reads U+FFFD. Both read U+FFFD now.
//
// Found in review hX2.
func TestFailureMessagesAreUTF8(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("X-Note", "caf\xe9")
		w.WriteHeader(http.StatusOK)
		return true
	})
	c, _ := open(t, nil)
	resp, err := c.Send(idemretry.NewRequest("GET", srv.URL+"/note"))
	require.NoError(t, err)
	assert.Equal(t, "caf\uFFFD", resp.Headers.Get("X-Note"))

	id := "pay:" + strings.Repeat("заказ", 20)
	_, err = c.Send(&idemretry.Request{Method: "POST", URL: "ftp://example.co/" + strings.Repeat("é", 40), ActionID: id})
	require.Error(t, err)
	assert.True(t, utf8.ValidString(idemretry.FailureOf(err).Message), "%q", idemretry.FailureOf(err).Message)
	err = c.Forget("")
	require.Error(t, err)
	r := &idemretry.Request{Method: "POST", URL: "http://127.0.0.1:1/", ActionID: strings.Repeat("ü", 1000)}
	_, err = c.Send(r)
	require.Error(t, err)
	assert.True(t, utf8.ValidString(idemretry.FailureOf(err).Message), "%q", idemretry.FailureOf(err).Message)
}

// Messages name what a Kotlin or Swift developer has (ActionID, Close,
// TimeoutMillis), never what only Go's API has: a payment without an
// ActionID was refused naming WithAction, a held directory told the app to
// wait with WithLockWait, and timeouts and Close said "context". (Every
// test's kindOf checks its message the same way.) Found in issue 30,
// item 5.
func TestFailureMessagesNameOnlyTheMobileAPI(t *testing.T) {
	t.Parallel()
	// The check knows the Go API's names, and the mobile API's.
	words, err := loadGoWords()
	require.NoError(t, err)
	for _, w := range []string{"WithAction", "WithLockWait", "WithJournalDir", "Transport", "ErrLocked", "context"} {
		assert.True(t, words.MatchString("a "+w+" b"), w)
	}
	assert.False(t, words.MatchString("Client Close ActionID TimeoutMillis KindJournal Idempotency-Key Retry-After"))
	srv := newPayServer(t)
	c, dir := open(t, nil)
	messages := map[string]string{}

	r := payment(srv, "", "100")
	_, err = c.Send(r)
	require.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	assert.ErrorIs(t, err, root.ErrActionRequired)
	assert.Equal(t, "idemretry: request names no action: POST "+srv.URL+"/charges has neither an ActionID nor an Idempotency-Key header", err.Error())
	messages["no action"] = err.Error()

	_, err = idemretry.NewClient(dir, nil)
	require.Equal(t, idemretry.KindJournal, kindOf(t, err), "%v", err)
	assert.ErrorIs(t, err, filejournal.ErrLocked)
	assert.Equal(t, "idemretry: journal locked: "+dir+" is held by another Client, in this process or another: Close it first, or use another directory", err.Error())
	messages["locked"] = err.Error()

	srv.setAfterCommit(holdUntilGone)
	r = payment(srv, "pay:timeout", "100")
	r.TimeoutMillis = 1000
	_, err = c.Send(r)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	messages["timeout"] = err.Error()

	srv.setAfterCommit(nil)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	})
	r = payment(srv, "pay:503", "100")
	r.TimeoutMillis = 1500
	_, err = c.Send(r)
	require.Equal(t, idemretry.KindGaveUp, kindOf(t, err), "%v", err)
	assert.ErrorIs(t, err, root.ErrWaitExceedsDeadline)
	messages["gave up"] = err.Error()

	srv.setBefore(nil)
	srv.setAfterCommit(holdUntilGone)
	done := make(chan error, 1)
	go func() {
		_, err := c.Send(payment(srv, "pay:closed", "100"))
		done <- err
	}()
	<-srv.committed
	<-srv.committed // pay:timeout's, then pay:closed's
	require.NoError(t, c.Close())
	err = <-done
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	assert.ErrorIs(t, err, context.Canceled)
	messages["closed"] = err.Error()
	for what, msg := range messages {
		t.Logf("%s: %s", what, msg)
	}
}

// A journal's own error already says what failed ("idemretry: journal
// close: ..."): the failure's message says it once, not "journal close:
// journal close: ...", and keeps the cause for errors.Is.
func TestKindJournalSaysTheOperationOnce(t *testing.T) {
	t.Parallel()
	cause := errors.New("no space left on device")
	for _, c := range []struct {
		err  error
		what string
		want string
	}{
		{joinErr("idemretry: journal close: fingerprint.key deleted and not made again", cause), "close",
			"idemretry: journal close: fingerprint.key deleted and not made again: no space left on device"},
		{joinErr("idemretry: journal sync", cause), "sync", "idemretry: journal sync: no space left on device"},
		{cause, "forget \"pay:1\"", "idemretry: journal forget \"pay:1\": no space left on device"},
	} {
		f := idemretry.JournalFailure(c.err, c.what)
		if got := idemretry.FailureOf(f).Message; got != c.want {
			t.Errorf("message %q, want %q", got, c.want)
		}
		if strings.Count(f.Error(), "journal "+c.what) != 1 {
			t.Errorf("%q says %q more than once", f.Error(), "journal "+c.what)
		}
		if !errors.Is(f, cause) {
			t.Errorf("the cause is lost: %v", f)
		}
	}
}

// joinErr is msg wrapping cause, as the journals' errors are.
func joinErr(msg string, cause error) error { return &wrapped{msg, cause} }

type wrapped struct {
	msg   string
	cause error
}

func (w *wrapped) Error() string { return w.msg + ": " + w.cause.Error() }

func (w *wrapped) Unwrap() error { return w.cause }

// The four outcomes are the Go package's Kinds, with its values, which
// never change; every kind is one of them.
func TestKindsAreOutcomes(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []int32{0, 1, 2, 3}, []int32{idemretry.OutcomePending, idemretry.OutcomeDone, idemretry.OutcomeNotSent, idemretry.OutcomeRefused})
	assert.Equal(t, []int32{int32(root.Pending), int32(root.Done), int32(root.NotSent), int32(root.Refused)},
		[]int32{idemretry.OutcomePending, idemretry.OutcomeDone, idemretry.OutcomeNotSent, idemretry.OutcomeRefused})
	want := map[int32]int32{
		idemretry.KindNone:                idemretry.OutcomeDone,
		idemretry.KindOther:               idemretry.OutcomePending,
		idemretry.KindInvalidRequest:      idemretry.OutcomeRefused,
		idemretry.KindNetwork:             idemretry.OutcomeNotSent,
		idemretry.KindMaybeProcessed:      idemretry.OutcomePending,
		idemretry.KindGaveUp:              idemretry.OutcomePending,
		idemretry.KindWindowExpired:       idemretry.OutcomeRefused,
		idemretry.KindFingerprintMismatch: idemretry.OutcomeRefused,
		idemretry.KindClockSkew:           idemretry.OutcomeRefused,
		idemretry.KindJournal:             idemretry.OutcomeRefused,
		idemretry.KindClosed:              idemretry.OutcomeRefused,
		idemretry.KindParked:              idemretry.OutcomePending,
		idemretry.KindOutcomeUnknown:      idemretry.OutcomeRefused,
	}
	for kind, outcome := range want {
		assert.Equal(t, outcome, (&idemretry.Failure{Kind: kind}).Outcome(), "kind %d", kind)
	}
	assert.Equal(t, idemretry.OutcomePending, (&idemretry.Failure{Kind: 99}).Outcome(), "a kind of a later version reads the safe way")
	assert.Equal(t, idemretry.OutcomeDone, idemretry.ErrorOutcome(nil))
	assert.Equal(t, idemretry.OutcomePending, idemretry.ErrorOutcome(errors.New("app's own")))
}

// A Send's failure is of the outcome the Go package gives the error it
// wraps (root.OutcomeOf), over real sends: refused dials, an answer lost,
// the retries stopping at a 503, a parked action, another payload under
// the action, a closed Client.
func TestFailureOutcomeIsTheGoPackages(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	offline := "http://" + ln.Addr().String() + "/charges"
	require.NoError(t, ln.Close())
	srv := newPayServer(t)
	lost := newPayServer(t)
	lost.setAfterCommit(holdUntilGone)
	busy := newPayServer(t)
	busy.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Retry-After", "3600")
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return true
	})
	c, _ := open(t, nil)
	_, err = c.Send(payment(srv, "pay:first", "1"))
	require.NoError(t, err)

	offlineReq := &idemretry.Request{Method: "POST", URL: offline, Body: []byte("{}"), ActionID: "pay:offline", TimeoutMillis: 1500}
	lostReq := payment(lost, "pay:lost", "1")
	lostReq.TimeoutMillis = 1000
	for _, c := range []struct {
		send    func() error
		kind    int32
		outcome int32
	}{
		{func() error { _, err := c.Send(offlineReq); return err }, idemretry.KindNetwork, idemretry.OutcomeNotSent},
		{func() error { _, err := c.Send(lostReq); return err }, idemretry.KindMaybeProcessed, idemretry.OutcomePending},
		{func() error { _, err := c.Send(payment(busy, "pay:busy", "1")); return err }, idemretry.KindGaveUp, idemretry.OutcomePending},
		{func() error { _, err := c.Send(payment(srv, "pay:first", "2")); return err }, idemretry.KindFingerprintMismatch, idemretry.OutcomeRefused},
		{func() error { _, err := c.Send(payment(srv, "", "2")); return err }, idemretry.KindInvalidRequest, idemretry.OutcomeRefused},
	} {
		err := c.send()
		require.Error(t, err)
		f := idemretry.FailureOf(err)
		assert.Equal(t, c.kind, f.Kind, "%v", err)
		assert.Equal(t, c.outcome, f.Outcome(), "%v", err)
		assert.Equal(t, c.outcome, idemretry.ErrorOutcome(err))
		assert.Equal(t, c.outcome, int32(root.OutcomeOf(nil, errors.Unwrap(err)).Kind), "the Go package's outcome of %v", errors.Unwrap(err))
	}
	require.NoError(t, c.Close())
	_, err = c.Send(payment(srv, "pay:after", "1"))
	assert.Equal(t, idemretry.KindClosed, idemretry.ErrorKind(err))
	assert.Equal(t, idemretry.OutcomeRefused, idemretry.ErrorOutcome(err))
	assert.Equal(t, idemretry.OutcomeRefused, int32(root.OutcomeOf(nil, errors.Unwrap(err)).Kind))
}
