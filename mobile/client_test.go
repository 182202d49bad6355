package idemretry_test

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	root "github.com/idemretry/idemretry"
	idemretry "github.com/idemretry/idemretry/mobile"
)

func TestSendPaysOnceAndReplays(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
func TestSendLowerCaseMethodIsKeyed(t *testing.T) {
	t.Parallel()
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

func TestSendConcurrentTapsPayOnce(t *testing.T) {
	t.Parallel()
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

// A payment named by its ActionID may have been charged
// (KindMaybeProcessed); it is sent again, as the kind says, with the same
// ActionID, by code (a newer version of the app, a retry helper) that also
// sets an Idempotency-Key header of its own. The header names the action
// to the Transport, the ActionID is ignored, and the resend went out under
// a new key: a second charge. A request named both ways is refused before
// anything is sent, with KindInvalidRequest.
//
// Found in review hX2.
func TestSendActionIDAndOwnKeyRefused(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	key := maybePaid(t, srv, dir, payment(srv, "pay:both", "100"))

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	sent := srv.requestCount()
	r := payment(srv, "pay:both", "100")
	r.Headers.Set("idempotency-key", "order-own-key")
	_, err = c.Send(r)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges, "sent again under another key")
	assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	assert.Equal(t, sent, srv.requestCount())

	// Named one way, it is sent: the ActionID's resend is the replay.
	resp, err := c.Send(payment(srv, "pay:both", "100"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges = srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// A URL that no network can ever reach (a port out of
// range, a host with no name: ":80" dials this device) was taken as a
// network failure: retried until the timeout, KindNetwork ("send it again
// when the network is back"), and its action left pending in the journal,
// for Resume to send again at every start. It is a bad request: refused
// at once, KindInvalidRequest, nothing journaled.
//
// Found in review hX2.
func TestSendUnreachableURLRefused(t *testing.T) {
	t.Parallel()
	c, _ := open(t, nil)
	for _, u := range []string{
		"http://127.0.0.1:99999/charges",
		"http://127.0.0.1:0/charges",
		"http://:80/charges",
		"https://:443/charges",
	} {
		t.Run(u, func(t *testing.T) {
			start := time.Now()
			_, err := c.Send(&idemretry.Request{Method: "POST", URL: u, Body: []byte("{}"), ActionID: "pay:url", TimeoutMillis: 3000})
			assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
			assert.Less(t, time.Since(start), 2*time.Second, "retried")
		})
	}
	l, err := c.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len(), "a request that cannot be sent was journaled")
}

// The server charges the payment and answers 303 See Other
// to the receipt, on a host that cannot be reached now (the network
// dropped). The payment was made: the Failure must say MaybeProcessed,
// not KindNetwork's "none of the attempts can have reached the server".
//
// Found in review hX2.
func TestSendChargedThenRedirectFails(t *testing.T) {
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
	r := payment(srv, "pay:see-other", "100")
	r.TimeoutMillis = 2000
	_, err = c.Send(r)
	require.Error(t, err)
	f := idemretry.FailureOf(err)
	_, charges := srv.snapshot()
	require.Len(t, charges, 1, "the server charged")
	assert.True(t, f.MaybeProcessed, "kind %d: %s", f.Kind, f.Message)
	assert.Equal(t, idemretry.KindMaybeProcessed, f.Kind, f.Message)
	assert.Equal(t, "pay:see-other", f.ActionID)
	for k := range charges {
		assert.Equal(t, k, f.Key)
	}
	assert.EqualValues(t, 303, f.Status)

	// Sent again, as the kind says: the server's replay (this server
	// stores its charge's answer), no second charge.
	resp, err := c.Send(payment(srv, "pay:see-other", "100"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges = srv.snapshot()
	assert.Len(t, charges, 1)
}

// A header net/http never sends (a control character other than HTAB in a
// value, anything but a token in a name) is refused before the action is
// journaled, KindInvalidRequest, nothing sent: before, a value with \x01,
// DEL or ESC was journaled and retried until the timeout, and reported
// KindMaybeProcessed though no byte left the process. What net/http sends
// (HTAB, UTF-8) is sent. Found in issue 26, item 15.
func TestSendRefusesHeadersNetHTTPNeverSends(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	c, _ := open(t, nil)
	// netHTTPSends reports whether net/http itself sends a request with
	// the header name: value.
	plain := &http.Transport{}
	defer plain.CloseIdleConnections()
	netHTTPSends := func(name, value string) bool {
		req, err := http.NewRequest("GET", srv.URL+"/probe", nil)
		require.NoError(t, err)
		req.Header[name] = []string{value}
		resp, err := plain.RoundTrip(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	}
	for i, h := range []struct{ name, value string }{
		{"Authorization", "Bearer sk_\x01b"},
		{"Authorization", "Bearer sk_\x7fb"},
		{"Authorization", "Bearer sk_\x1b[31m"},
		{"Authorization", "Bearer sk_\x0bb"},
		{"Authorization", "Bearer sk_\rb"},
		{"Authorization", "Bearer sk_\x00b"},
		{"X-No\x7fte", "sk_1"},
		{"X-No\x01te", "sk_1"},
		{"X-No\x1bte", "sk_1"},
		{"X-Not\u00e9", "sk_1"},
		{"X-Note:", "sk_1"},
	} {
		t.Run(fmt.Sprintf("%q: %q", h.name, h.value), func(t *testing.T) {
			before := srv.requestCount()
			require.False(t, netHTTPSends(h.name, h.value), "net/http sends it")
			require.Equal(t, before, srv.requestCount())
			r := payment(srv, fmt.Sprintf("pay:header-%d", i), "100")
			r.Headers.Set(h.name, h.value)
			r.TimeoutMillis = 2000
			_, err := c.Send(r)
			assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
			f := idemretry.FailureOf(err)
			assert.False(t, f.MaybeProcessed, f.Message)
			assert.Zero(t, f.Attempts, f.Message)
			assert.NotContains(t, f.Message, "sk_", "a header's value (a credential) in the message")
			assert.Equal(t, before, srv.requestCount(), "sent")
		})
	}
	l, err := c.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len(), "a request that cannot be sent was journaled")

	for i, v := range []string{"a\tb", "caf\u00e9", " padded "} {
		require.True(t, netHTTPSends("X-Note", v))
		r := payment(srv, fmt.Sprintf("pay:sent-%d", i), "100")
		r.Headers.Set("X-Note", v)
		resp, err := c.Send(r)
		require.NoError(t, err, "%q", v)
		assert.EqualValues(t, 200, resp.Status)
	}
}

func TestHeadersLines(t *testing.T) {
	t.Parallel()
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

func TestNewClientRefusesBadArguments(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	o := idemretry.NewOptions()
	assert.Equal(t, int64(24*time.Hour/time.Millisecond), o.KeyWindowMillis)
	assert.Equal(t, idemretry.DefaultTimeoutMillis, o.TimeoutMillis)
}

// Close ends a Send in progress promptly; its action stays pending with its
// key, and the next Client resumes it.
func TestClientCloseEndsSendsInProgress(t *testing.T) {
	t.Parallel()
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
	assert.EqualValues(t, 1, idemretry.FailureOf(err).Attempts)

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

// The app closes the Client (it is exiting) while other
// threads pay, list, sync, forget and resume. Close returns promptly;
// every call ends, none panics, and each error has a kind the app branches
// on: KindClosed for a call made after Close, KindMaybeProcessed for a
// payment cut short after it may have reached the server (never one
// that says "not charged" about a charged payment). The next Client finds
// every payment charged once, under the key it holds.
//
// Found in review hX2.
func TestClientCloseWhileBusy(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		select { // a slow charge: payments are in flight at Close
		case <-time.After(100 * time.Millisecond):
		case <-r.Context().Done():
		}
		return false
	})
	c, dir := open(t, nil)
	var wg sync.WaitGroup
	start := make(chan struct{})
	kinds := make(chan int32, 1000)
	maybe := 0
	var mu sync.Mutex
	paid := map[string]bool{}
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; ; i++ {
				id := fmt.Sprintf("pay:g%d-%d", g, i%3)
				var err error
				switch i % 5 {
				case 0, 1, 2:
					var resp *idemretry.Response
					resp, err = c.Send(payment(srv, id, "10"))
					if err == nil {
						mu.Lock()
						paid[id] = true
						mu.Unlock()
						assert.EqualValues(t, 200, resp.Status)
					}
				case 3:
					_, err = c.Unfinished()
					if err == nil {
						err = c.Sync()
					}
				case 4:
					_, err = c.Resume(rebuildWith(func(a string) (*idemretry.Request, error) { return payment(srv, "", "10"), nil }))
				}
				if err != nil {
					kinds <- idemretry.ErrorKind(err)
					if idemretry.ErrorKind(err) == idemretry.KindClosed {
						return
					}
				}
			}
		}()
	}
	close(start)
	time.Sleep(300 * time.Millisecond)
	closed := time.Now()
	require.NoError(t, c.Close())
	assert.Less(t, time.Since(closed), 10*time.Second)
	wg.Wait()
	close(kinds)
	for k := range kinds {
		assert.Contains(t, []int32{idemretry.KindClosed, idemretry.KindMaybeProcessed}, k)
		if k == idemretry.KindMaybeProcessed {
			maybe++
		}
	}
	t.Logf("%d payments cut short by Close", maybe)

	srv.setAfterCommit(nil)
	c2, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Resume(rebuildWith(func(a string) (*idemretry.Request, error) { return payment(srv, "", "10"), nil }))
	require.NoError(t, err)
	l, err := c2.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len())
	_, charges := srv.snapshot()
	for k, n := range charges {
		assert.Equal(t, 1, n, "key %s", k)
	}
	assert.LessOrEqual(t, len(charges), 18)
	assert.NotEmpty(t, paid)
}

// The app's reconcile code forgets an action while a Send of
// it is in flight (the server, asked, had no charge yet: it was being
// made). The Send succeeds; the user taps again on the same checkout
// (same ActionID), which should get the replay, and got a new key: a
// second charge. Forget refuses an action being sent, nothing changed.
//
// Found in review hX2.
func TestClientForgetWhileSending(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(300 * time.Millisecond)
		return false
	})
	c, _ := open(t, nil)
	done := make(chan error, 1)
	go func() {
		_, err := c.Send(payment(srv, "pay:f", "1"))
		done <- err
	}()
	key := <-srv.committed
	err := c.Forget("pay:f")
	assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
	require.NoError(t, <-done)
	srv.setAfterCommit(nil)

	resp, err := c.Send(payment(srv, "pay:f", "1"))
	require.NoError(t, err)
	assert.True(t, resp.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}
