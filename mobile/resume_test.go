package idemretry_test

import (
	"context"
	"errors"
	"io"
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

func TestResumeOutcomes(t *testing.T) {
	t.Parallel()
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
	assert.True(t, b.Failure.MaybeProcessed, "pay:b reached the server")
	assert.NotEmpty(t, b.Failure.Key)
	assert.EqualValues(t, 1, b.Failure.Attempts)
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

// The app's next version sets an Idempotency-Key header of
// its own on its payment requests (its order's id, say), and its Rebuilder
// builds the request of a payment the previous version left pending,
// named by ActionID, the new way. Resume must not send that payment under
// another key than the one the server may have charged it under: the new
// key is a second charge. Nothing is sent, and the action stays pending.
//
// Found in review hX2.
func TestResumeRebuiltWithAnotherKey(t *testing.T) {
	t.Parallel()
	for name, withID := range map[string]bool{"id left empty": false, "same id": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newPayServer(t)
			dir := filepath.Join(t.TempDir(), "idemretry")
			key := maybePaid(t, srv, dir, payment(srv, "pay:v1-order", "100"))

			c, err := idemretry.NewClient(dir, nil)
			require.NoError(t, err)
			defer c.Close()
			out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
				r := payment(srv, "", "100")
				if withID {
					r.ActionID = id
				}
				r.Headers.Set("Idempotency-Key", "order-v2-own-key")
				return r, nil
			}))
			require.NoError(t, err)
			require.EqualValues(t, 1, out.Len())
			o := out.Get(0)
			_, charges := srv.snapshot()
			assert.Equal(t, map[string]int{key: 1}, charges, "resumed under another key")
			require.Nil(t, o.Response)
			require.NotNil(t, o.Failure)
			assert.Equal(t, idemretry.KindInvalidRequest, o.Failure.Kind, o.Failure.Message)
			assert.Equal(t, "pay:v1-order", o.Failure.ActionID)
			assert.Equal(t, key, o.Failure.Key)
			assert.True(t, o.Failure.MaybeProcessed, "the action was sent before")

			l, err := c.Unfinished()
			require.NoError(t, err)
			require.EqualValues(t, 1, l.Len())
			assert.Equal(t, key, l.Get(0).Key)
		})
	}
}

// An action the app named with an Idempotency-Key header of
// its own is listed as "key:" and the key. A Rebuilder that leaves the
// header out (it rebuilds from the order, as the doc asks) gets the
// action sent under the listed key; before, Resume set ActionID to
// "key:...", which Send refuses, so such an action could never be resumed.
// A header that names another key is refused, nothing sent.
//
// Found in review hX2.
func TestResumeOwnKeyAction(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	req := payment(srv, "", "250")
	req.Headers.Set("Idempotency-Key", "app-key-77")
	key := maybePaid(t, srv, dir, req)
	require.Equal(t, "app-key-77", key)

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len())
	require.Equal(t, "key:app-key-77", l.Get(0).ActionID)

	// A header naming another key: refused, nothing sent.
	sent := srv.requestCount()
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		r := payment(srv, "", "250")
		r.Headers.Set("Idempotency-Key", "app-key-78")
		return r, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	require.NotNil(t, out.Get(0).Failure)
	assert.Equal(t, idemretry.KindInvalidRequest, out.Get(0).Failure.Kind, out.Get(0).Failure.Message)
	assert.Equal(t, sent, srv.requestCount())

	// The header left out: sent under the listed key, replayed.
	out, err = c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		return payment(srv, "", "250"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	require.NotNil(t, o.Response, "%+v", o.Failure)
	assert.True(t, o.Response.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// An action recorded outcome-unknown because the server
// refused its key as used for another payload (its key window far from
// over) is listed by Resume with the kind Send gives it,
// KindOutcomeUnknown, not KindWindowExpired ("the key is older than the
// key window").
//
// Found in review hX2.
func TestResumeOutcomeUnknownKind(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"title":"Idempotency-Key is already used"}`)
		return true
	})
	c, _ := open(t, nil)
	_, err := c.Send(payment(srv, "pay:reused", "300"))
	require.Equal(t, idemretry.KindOutcomeUnknown, kindOf(t, err), "%v", err)
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		t.Errorf("Rebuild(%q) called for an action whose outcome is unknown", id)
		return nil, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	assert.True(t, o.Skipped)
	require.NotNil(t, o.Failure)
	assert.Equal(t, idemretry.KindOutcomeUnknown, o.Failure.Kind, o.Failure.Message)
	assert.True(t, o.Failure.MaybeProcessed)
	assert.NotContains(t, o.Failure.Message, "window")
	assert.Equal(t, 1, srv.requestCount())
}

// A Rebuilder that returns a request with another method
// than POST or PATCH (the only ones journaled, so the only ones Resume
// lists) had it sent, without a key and unchecked against the action's
// fingerprint, and the action left pending as if nothing happened. It is
// refused, nothing sent.
//
// Found in review hX2.
func TestResumeRebuiltWithUnkeyedMethod(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	maybePaid(t, srv, dir, payment(srv, "pay:m", "100"))
	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	sent := srv.requestCount()
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		r := payment(srv, "", "100")
		r.Method = "PUT"
		return r, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	assert.Nil(t, o.Response)
	require.NotNil(t, o.Failure)
	assert.Equal(t, idemretry.KindFingerprintMismatch, o.Failure.Kind, o.Failure.Message)
	assert.True(t, o.Failure.MaybeProcessed)
	assert.Equal(t, sent, srv.requestCount(), "sent")
}

// Resume lists the unfinished actions, then sends them one
// by one; one of them is forgotten meanwhile (the app reconciled it: the
// server had charged it). Resume sent it anyway, as a new action under a
// new key: a second charge. An action forgotten since it was listed is
// not Resume's to bring back: skipped, nothing sent.
//
// Found in review hX2.
func TestResumeSkipsForgotten(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, _ := open(t, nil)
	for _, id := range []string{"pay:1", "pay:2"} {
		r := payment(srv, id, "1")
		r.TimeoutMillis = 1000
		_, err := c.Send(r)
		require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	}
	srv.setAfterCommit(nil)
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		if id == "pay:1" {
			// Another thread reconciles pay:2 meanwhile: charged.
			require.NoError(t, c.Forget("pay:2"))
		}
		return payment(srv, "", "1"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 2, out.Len())
	require.NotNil(t, out.Get(0).Response)
	assert.True(t, out.Get(0).Response.Replayed)
	assert.Equal(t, "pay:2", out.Get(1).ActionID)
	assert.True(t, out.Get(1).Skipped)
	assert.Nil(t, out.Get(1).Response, "a forgotten action was sent again")
	_, charges := srv.snapshot()
	assert.Len(t, charges, 2)
	for k, n := range charges {
		assert.Equal(t, 1, n, "key %s", k)
	}
}

// As TestResumeSkipsForgotten, with the Forget made while Resume rebuilds the
// action itself: refused, and the action is resumed under its key.
//
// Found in review hX2.
func TestResumeForgetWhileResuming(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, _ := open(t, nil)
	r := payment(srv, "pay:r", "1")
	r.TimeoutMillis = 1000
	_, err := c.Send(r)
	require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	key := idemretry.FailureOf(err).Key
	srv.setAfterCommit(nil)
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		err := c.Forget(id)
		assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
		return payment(srv, "", "1"), nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	require.NotNil(t, out.Get(0).Response, "%+v", out.Get(0).Failure)
	assert.True(t, out.Get(0).Response.Replayed)
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
}

// The app closes the Client (it is exiting) while Resume
// works through the actions a killed run left: Resume stops calling the
// app's Rebuilder (its database may be closed by now) and reports the
// actions left as KindClosed, skipped, nothing sent.
//
// Found in review hX2.
func TestResumeStopsAtClose(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, err := idemretry.NewClient(filepath.Join(t.TempDir(), "idemretry"), nil)
	require.NoError(t, err)
	defer c.Close()
	keys := map[string]string{}
	for _, id := range []string{"pay:1", "pay:2", "pay:3"} {
		r := payment(srv, id, "1")
		r.TimeoutMillis = 1000
		_, err := c.Send(r)
		require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
		keys[id] = idemretry.FailureOf(err).Key
	}
	srv.setAfterCommit(nil)
	sent := srv.requestCount()
	var rebuilt []string
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		rebuilt = append(rebuilt, id)
		require.NoError(t, c.Close()) // the app exits
		return payment(srv, "", "1"), nil
	}))
	require.NoError(t, err)
	assert.Equal(t, []string{"pay:1"}, rebuilt, "Rebuild called after Close")
	require.EqualValues(t, 3, out.Len())
	for i := int32(0); i < out.Len(); i++ {
		o := out.Get(i)
		require.NotNil(t, o.Failure)
		assert.Equal(t, idemretry.KindClosed, o.Failure.Kind, o.Failure.Message)
		assert.Equal(t, o.ActionID, o.Failure.ActionID)
		// Listed, so sent before: what the listing said of it.
		assert.True(t, o.Failure.MaybeProcessed, o.ActionID)
		assert.Equal(t, keys[o.ActionID], o.Failure.Key, o.ActionID)
		assert.EqualValues(t, 1, o.Failure.Attempts, o.ActionID)
	}
	assert.True(t, out.Get(1).Skipped)
	assert.Equal(t, sent, srv.requestCount())
}

// A Rebuilder that sets a header net/http never sends (DEL in a value) has
// its request refused, KindInvalidRequest, nothing sent, and the action
// left pending under its key (MaybeProcessed: it was sent before), not
// retried until the timeout and reported KindMaybeProcessed. Found in
// issue 26, item 15.
func TestResumeRebuiltWithControlCharacterHeader(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "idemretry")
	key := maybePaid(t, srv, dir, payment(srv, "pay:del", "100"))
	c, err := idemretry.NewClient(dir, &idemretry.Options{TimeoutMillis: 2000})
	require.NoError(t, err)
	defer c.Close()
	sent := srv.requestCount()
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		r := payment(srv, "", "100")
		r.Headers.Set("X-Trace", "a\x7fb")
		return r, nil
	}))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.Len())
	o := out.Get(0)
	assert.Nil(t, o.Response)
	require.NotNil(t, o.Failure)
	assert.Equal(t, idemretry.KindInvalidRequest, o.Failure.Kind, o.Failure.Message)
	assert.True(t, o.Failure.MaybeProcessed)
	assert.Equal(t, key, o.Failure.Key)
	assert.EqualValues(t, 1, o.Failure.Attempts, "the attempt of the run before")
	assert.Equal(t, sent, srv.requestCount(), "sent")
	l, err := c.Unfinished()
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Len())
	assert.Equal(t, key, l.Get(0).Key)
	assert.False(t, l.Get(0).OutcomeUnknown)
	assert.EqualValues(t, 1, l.Get(0).Attempts)
}

// The device's clock is set back after an action's key window ended (by
// the clock of the run that sent it): Send judges the window by the
// journal's time, which never runs back, and says KindWindowExpired;
// Resume said KindOutcomeUnknown ("the server refused its key"), judging
// by the clock alone. Both judge by the same time now, on either side of
// the bound past which the journal's time is not believed (its grace, 24
// hours ahead of the clock). Found in issue 26, item 15.
func TestResumeWindowExpiredAfterClockSetBack(t *testing.T) {
	t.Parallel()
	const window = 10 * time.Minute
	for name, tc := range map[string]struct {
		back time.Duration // how far the clock is set back
		kind int32
	}{
		"an hour":      {time.Hour, idemretry.KindWindowExpired},
		"beyond grace": {25 * time.Hour, idemretry.KindOutcomeUnknown},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := newPayServer(t)
			srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Retry-After", "3600")
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return true
			})
			dir := filepath.Join(t.TempDir(), "idemretry")
			// send sends the payment through a Transport whose clock is
			// ahead of this device's by ahead, as the device's was before
			// it was set back.
			send := func(ahead time.Duration) error {
				tr, err := root.NewTransport(nil, root.WithJournalDir(dir), root.WithKeyWindow(window), root.WithClock(aheadClock{ahead}))
				require.NoError(t, err)
				defer func() { require.NoError(t, tr.Close()) }()
				ctx, cancel := context.WithTimeout(root.WithAction(context.Background(), "pay:set-back"), 5*time.Second)
				defer cancel()
				hreq, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
				require.NoError(t, err)
				hreq.Header.Set("Content-Type", "application/json")
				resp, err := (&http.Client{Transport: tr}).Do(hreq)
				if err == nil {
					resp.Body.Close()
				}
				return err
			}
			require.NoError(t, send(tc.back-window-time.Minute)) // the 503, given up at once
			require.Equal(t, 1, srv.requestCount())
			err := send(tc.back) // its window is over
			require.ErrorIs(t, err, root.ErrKeyWindowExpired)
			require.Equal(t, 1, srv.requestCount())

			c, err := idemretry.NewClient(dir, &idemretry.Options{KeyWindowMillis: window.Milliseconds()})
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Send(payment(srv, "pay:set-back", "100"))
			require.Equal(t, tc.kind, kindOf(t, err), "%v", err)
			out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
				t.Errorf("Rebuild(%q) called for an action whose outcome is unknown", id)
				return nil, nil
			}))
			require.NoError(t, err)
			require.EqualValues(t, 1, out.Len())
			o := out.Get(0)
			require.NotNil(t, o.Failure)
			assert.True(t, o.Skipped)
			assert.Equal(t, tc.kind, o.Failure.Kind, "Send and Resume disagree: %s", o.Failure.Message)
			assert.True(t, o.Failure.MaybeProcessed)
			assert.EqualValues(t, 1, o.Failure.Attempts)
			assert.Equal(t, 1, srv.requestCount())
		})
	}
}
