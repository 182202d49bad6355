package idemretry_test

// hW3's review of the 307/308 hop of an unnamed payment (hW1's fix):
// what hopUnfinished takes for an unfinished hop.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// hopFlakyJournal fails the update of a 307/308 hop's done while failHop
// is set: the journal (a database whose connection was cut, a full disk)
// did not take it, and the Transport keeps the outcome in memory.
type hopFlakyJournal struct {
	*journal.Memory
	failHop atomic.Bool
}

func (j *hopFlakyJournal) Update(ctx context.Context, rec journal.Record) error {
	if j.failHop.Load() && rec.State == journal.StateDone && strings.Contains(rec.ActionID, " redirect:") {
		return errDiskGone
	}
	return j.Memory.Update(ctx, rec)
}

// Guarantee 2: once the hop has its final answer, an identical request is
// a deliberate repeat: a new payment. The hop's done did not reach the
// journal at once (the Transport holds it, to write before the hop is sent
// again); the journal then heals. The repeat must be a new payment, not a
// tap of a hop the journal still lists as pending, answered with the first
// payment's replay and charged nothing.
//
// Found in review hw3 (a2bb679; was TestHW3RepeatAfterAHopWhoseDoneIsUnlandedIsANewPayment).
func TestRedirectHopRepeatAfterAnUnlandedDoneIsANewPayment(t *testing.T) {
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	j := &hopFlakyJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j)
	client := &http.Client{Transport: tr}

	j.failHop.Store(true)
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 1, srv.chargeCount())

	j.failHop.Store(false) // the journal heals
	resp, err = client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":5}`))
	require.NoError(t, err)
	readAll(t, resp)
	assert.False(t, idemretry.IsReplay(resp), "the deliberate repeat was answered with the first payment's replay")
	assert.Equal(t, 2, srv.chargeCount(), "a deliberate repeat after the first payment finished was not charged: keys %v", keysOf(srv.seen()))
}

// Guarantee 3: a hop whose outcome is unknown (the server refused its key
// as used with another payload) is never sent again, under its key or a
// new one: an identical request is not a new payment either.
//
// Found in review hw3 (a2bb679; was TestHW3RepeatOfAPaymentWhoseHopIsUnknownIsNotPaid).
func TestRedirectHopUnknownRepeatIsNotPaid(t *testing.T) {
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	script := srv.script
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 2 { // the hop: refused as a key reused
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"type":"idempotency_error"}}`))
			return true
		}
		return script(n, w, r)
	}
	tr := transportOver(t, journal.NewMemory())
	client := &http.Client{Transport: tr}
	_, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":6}`))
	require.ErrorIs(t, err, idemretry.ErrKeyReused)
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":6}`))
	if err == nil {
		readAll(t, resp)
	}
	assert.Error(t, err, "a payment whose hop's outcome is unknown was sent again")
	assert.Zero(t, srv.chargeCount(), "keys %v", keysOf(srv.seen()))
}

// A hop to another host, tapped while in flight, with taps that all arrive
// at once, and with a duplicate window that has passed: one payment.
//
// Found in review hw3 (a2bb679; was TestHW3TapsWhileAHopToAnotherHostIsInFlight).
func TestRedirectHopToAnotherHostTapsInFlight(t *testing.T) {
	for _, dw := range []time.Duration{0, time.Nanosecond} {
		t.Run(dw.String(), func(t *testing.T) {
			pay := newSlowPayServer(t, 400*time.Millisecond)
			front := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Location", pay.URL+"/pay")
				w.WriteHeader(http.StatusTemporaryRedirect)
			})
			tr := transportOver(t, journal.NewMemory(), idemretry.WithDuplicateWindow(dw))
			client := &http.Client{Transport: tr}
			do := func() error {
				resp, err := client.Do(post(t, context.Background(), front.URL+"/redir", `{"amount":3}`))
				if err == nil {
					readAll(t, resp)
				}
				return err
			}
			first := make(chan error, 1)
			go func() { first <- do() }()
			require.Equal(t, 1, <-pay.arrived)
			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() { defer wg.Done(); assert.NoError(t, do()) }()
			}
			wg.Wait()
			require.NoError(t, <-first)
			assert.Equal(t, 1, pay.chargeCount(), "taps while the hop was in flight charged again: keys %v", keysOf(pay.seen()))
		})
	}
}

// README, guarantee 2: "an identical request while the hop is in flight in
// the Transport, or pending in the journal (also after a restart), goes
// out under the parent's key and joins the hop"; not covered "after a
// restart, a journal that hashes action ids". In the same process, on a
// journal that hashes ids, the hop whose answer was lost is pending: the
// tap must not pay again.
//
// Found in review hw3 (a2bb679; was TestHW3TapOfAPendingHopOnAHashingJournalSameProcess).
func TestRedirectHopTapWhilePendingOnAHashingJournal(t *testing.T) {
	srv := redirectingPayServer(t, http.StatusPermanentRedirect, 0)
	srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
	fj, err := filejournal.Open(t.TempDir(), filejournal.WithHashedIDs())
	require.NoError(t, err)
	defer fj.Close()
	// No keep-alive: net/http would resend the hop on a reused connection.
	tr, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournal(fj), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	client := &http.Client{Transport: tr}
	_, err = client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
	require.Error(t, err, "the hop's answer was lost")
	require.Equal(t, 1, srv.chargeCount())
	resp, err := client.Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":9}`))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, 1, srv.chargeCount(), "the tap of a payment whose hop is pending charged again: keys %v", keysOf(srv.seen()))
}

// hopResumer rebuilds the hop of a redirected payment: POST body to url.
type hopResumer struct{ url, body string }

func (h hopResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader(h.body))
}

func (h hopResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// After a restart, Resume resends the hop left pending; an identical
// request made while it is in flight is a tap of the payment: it joins the
// resumed hop, and nothing is charged again.
//
// Found in review hw3 (a2bb679; was TestHW3TapWhileResumeResendsThePendingHop).
func TestRedirectHopTapWhileResumeResendsIt(t *testing.T) {
	srv := redirectingPayServer(t, http.StatusTemporaryRedirect, 0)
	srv.commitThenDrop = map[int]bool{2: true} // the hop's first attempt
	tapArrived := make(chan struct{})
	script := srv.script
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		switch n {
		case 3: // the resumed hop: held until the tap's parent is at the server
			<-tapArrived
			time.Sleep(50 * time.Millisecond)
		case 4:
			close(tapArrived)
		}
		return script(n, w, r)
	}
	dir := t.TempDir()
	open := func() *idemretry.Transport {
		tr, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
		require.NoError(t, err)
		return tr
	}
	tr := open()
	_, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":4}`))
	require.Error(t, err, "the hop's answer was lost")
	require.NoError(t, tr.Close())
	tr = open()
	defer func() { require.NoError(t, tr.Close()) }()
	done := resumeAsync(context.Background(), tr, hopResumer{srv.URL + "/pay", `{"amount":4}`}, 1)
	require.Equal(t, 1, <-srv.arrived)
	require.Equal(t, 2, <-srv.arrived)
	require.Equal(t, 3, <-srv.arrived) // the resumed hop, held
	resp, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL+"/redir", `{"amount":4}`))
	require.NoError(t, err)
	readAll(t, resp)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, 1, srv.chargeCount(), "keys %v", keysOf(srv.seen()))
	assert.True(t, idemretry.IsReplay(resp))
	assert.Len(t, srv.seen(), 4, "the tap's hop joined the resumed one: nothing more sent")
}
