package idemretry_test

// A named action's body of KeyedMinBody bytes or more gets a keyed
// fingerprint (fingerprint.go): each new record draws its own salt, so every other request of the
// action (a double tap, a resend after a restart, Resume's rebuilt one, a
// Transport of another process) is checked by computing its fingerprint
// with the record's or the leader's secret. These tests hold it to
// guarantees 2 and 9 over HTTP.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// largePayload is a named upload big enough for the keyed form: four full
// chunks of 64 KiB and a partial one.
func largePayload(order string) string {
	const n = 4<<16 + 1234
	line := `{"line":"` + order + `","amount":1000}` + "\n"
	return strings.Repeat(line, n/len(line)+1)[:n]
}

// changedAt returns p with byte i flipped.
func changedAt(p string, i int) string {
	b := []byte(p)
	b[i] ^= 0x20
	return string(b)
}

// keyedPrefix is how a keyed fingerprint begins; a plain SHA-256 does so
// once in 2^32.
var keyedPrefix = []byte{'i', 'r', 'k', 1}

// A large named payment charged, its answer lost; the app restarts (a new
// Transport on the same file journal) and pays again: the record's keyed
// fingerprint, made under a secret the new Transport did not draw, must
// match the same payload (sent under the first key, replayed) and refuse
// a payload changed in its first chunk, its last byte, or its length, with
// nothing sent. By a live resend and by Resume.
func TestLargeNamedActionIsOneActionAcrossRestarts(t *testing.T) {
	for _, how := range []string{"live resend", "resume"} {
		t.Run(how, func(t *testing.T) {
			srv := newPayServer(t)
			srv.commitThenDrop = map[int]bool{1: true}
			payload := largePayload("L-1")
			dir := t.TempDir()
			ctx := idemretry.WithAction(context.Background(), "pay:L-1")

			first, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
			require.NoError(t, err)
			_, err = first.RoundTrip(post(t, ctx, srv.URL, payload))
			require.Error(t, err, "the answer was lost")
			require.NoError(t, first.Close())

			tr := upgraded(t, dir, nil)
			recs, err := tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			require.Len(t, recs, 1)
			if idemretry.MakesKeyedFingerprints(tr) {
				require.Equal(t, keyedPrefix, recs[0].Fingerprint[:4], "a large named body's fingerprint is keyed")
			} else {
				require.Equal(t, legacyFingerprint(http.MethodPost, srv.URL, payload), recs[0].Fingerprint, "plain where keyed ones are not made")
			}

			for _, other := range []string{changedAt(payload, 10), changedAt(payload, len(payload)-1), payload[:len(payload)-1], payload + "x"} {
				err := sendErr(tr, post(t, ctx, srv.URL, other))
				require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
			}
			require.Len(t, srv.seen(), 1, "a changed payload was sent")

			switch how {
			case "live resend":
				resp := roundTrip(t, tr, post(t, ctx, srv.URL, payload))
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.True(t, idemretry.IsReplay(resp))
			case "resume":
				app := &appResumer{url: srv.URL, orders: map[string]string{"pay:L-1": payload}}
				res, err := tr.Resume(context.Background(), app, 0)
				require.NoError(t, err)
				require.Len(t, res, 1)
				require.NoError(t, res[0].Err)
				assert.Equal(t, http.StatusCreated, res[0].Status)
			}
			srv.requireOnePayment(t, 2)
		})
	}
}

// Resume's rebuilt request with another payload than the keyed record's
// is refused (ErrFingerprintMismatch), nothing sent.
func TestResumeOfLargeNamedActionWithAnotherPayloadIsRefused(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	payload := largePayload("L-2")
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	_, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:L-2"), srv.URL, payload))
	require.Error(t, err)
	app := &appResumer{url: srv.URL, orders: map[string]string{"pay:L-2": changedAt(payload, 3<<16)}}
	res, err := tr.Resume(context.Background(), app, 0)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0].Err, idemretry.ErrFingerprintMismatch)
	require.Len(t, srv.seen(), 1)
}

// A double tap of a large named payment: each tap's request draws its own
// secret, and the taps that arrive while the first is in flight must join
// it (one request, one charge, each its own copy of the answer), while a
// tap with another payload under the same action is refused.
func TestLargeNamedDoubleTapIsOnePayment(t *testing.T) {
	srv := newSlowPayServer(t, 300*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	payload := largePayload("L-3")
	ctx := idemretry.WithAction(context.Background(), "pay:L-3")

	const taps = 4
	var wg sync.WaitGroup
	bodies := make([]string, taps)
	errs := make([]error, taps+1)
	tap := func(i int, p string) {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, p))
		if errs[i] = err; err == nil {
			bodies[i] = readAll(t, resp)
		}
	}
	wg.Add(1)
	go tap(0, payload)
	<-srv.arrived
	for i := 1; i < taps; i++ {
		wg.Add(1)
		go tap(i, payload)
	}
	wg.Add(1)
	go tap(taps, changedAt(payload, len(payload)/2))
	wg.Wait()

	for i := 0; i < taps; i++ {
		require.NoError(t, errs[i], "tap %d", i)
		assert.Equal(t, bodies[0], bodies[i], "tap %d read another answer", i)
	}
	require.ErrorIs(t, errs[taps], idemretry.ErrFingerprintMismatch)
	assert.Len(t, srv.seen(), 1, "a tap sent a request of its own")
	assert.Equal(t, 1, srv.chargeCount())
}

// Two Transports on one journal, as two processes of a fleet share one:
// the second sends the large named payment while the first's record holds
// it pending under a secret the second never drew. It must go out under
// the first key (replayed), and another payload must be refused.
func TestLargeNamedActionSharedJournal(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	payload := largePayload("L-4")
	ctx := idemretry.WithAction(context.Background(), "pay:L-4")
	leftPending(t, j, post(t, ctx, srv.URL, payload))
	tr := transportOver(t, j, idemretry.WithMaxRetries(0))
	require.ErrorIs(t, sendErr(tr, post(t, ctx, srv.URL, changedAt(payload, 0))), idemretry.ErrFingerprintMismatch)
	resp := roundTrip(t, tr, post(t, ctx, srv.URL, payload))
	assert.True(t, idemretry.IsReplay(resp))
	srv.requireOnePayment(t, 2)
}

// Every form of the fingerprint names the same payloads alike: a large
// body whose length is not known before it is read (plain form), and one
// named by the caller's key (keyed), are each one action across a
// restart; an unnamed large one keeps the plain form, which names it, and
// is one payment when tapped twice.
func TestLargeBodyForms(t *testing.T) {
	payload := largePayload("L-5")
	for _, kind := range []string{"unknown length", "caller key"} {
		t.Run(kind, func(t *testing.T) {
			srv := newPayServer(t)
			srv.commitThenDrop = map[int]bool{1: true}
			j := journal.NewMemory()
			const key = "8a1c6e7d-3b2f-4d5e-9f0a-1b2c3d4e5f60"
			req := func(p string) *http.Request {
				r := post(t, idemretry.WithAction(context.Background(), "pay:L-5"), srv.URL, p)
				switch kind {
				case "unknown length":
					r.ContentLength = -1
				case "caller key":
					r = post(t, context.Background(), srv.URL, p)
					r.Header.Set("Idempotency-Key", key)
				}
				return r
			}
			leftPending(t, j, req(payload))
			recs, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			require.Len(t, recs, 1)
			keyed := bytes.Equal(recs[0].Fingerprint[:4], keyedPrefix)
			assert.Equal(t, kind == "caller key" && idemretry.MakesKeyedFingerprints(transportOver(t, j)), keyed, "keyed form")
			if !keyed {
				assert.Equal(t, legacyFingerprint(http.MethodPost, srv.URL, payload), recs[0].Fingerprint)
			}
			tr := transportOver(t, j, idemretry.WithMaxRetries(0))
			require.ErrorIs(t, sendErr(tr, req(changedAt(payload, 5))), idemretry.ErrFingerprintMismatch)
			assert.True(t, idemretry.IsReplay(roundTrip(t, tr, req(payload))))
			srv.requireOnePayment(t, 2)
		})
	}
	t.Run("unnamed", func(t *testing.T) {
		srv := newPayServer(t)
		srv.commitThenDrop = map[int]bool{1: true}
		j := journal.NewMemory()
		leftPending(t, j, post(t, context.Background(), srv.URL, payload))
		recs, err := j.Unfinished(context.Background())
		require.NoError(t, err)
		require.Len(t, recs, 1)
		fp := legacyFingerprint(http.MethodPost, srv.URL, payload)
		assert.Equal(t, fp, recs[0].Fingerprint, "an unnamed action is named by its plain fingerprint")
		assert.Equal(t, fmt.Sprintf("fp:%x", fp[:]), recs[0].ActionID)
	})
}

// The upgrade tests in fingerprint_test.go with a body of the keyed size:
// the previous release stored plain fingerprints for every action, and
// the upgraded Transport must recognise its large named payload by them.
func TestUpgradeLargeNamedActionLeftPendingByThePreviousRelease(t *testing.T) {
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	payload := largePayload("L-6")
	const key = "3e4f5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7"
	dir, fo, old := previousRelease(t, false)
	_, created, err := old.Reserve(context.Background(), journal.Record{ActionID: "pay:L-6", Key: key,
		Fingerprint: legacyFingerprint(http.MethodPost, srv.URL, payload), CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	chargeAndLose(t, srv.URL, key, payload)
	require.NoError(t, old.Close())

	tr := upgraded(t, dir, fo)
	ctx := idemretry.WithAction(context.Background(), "pay:L-6")
	err = sendErr(tr, post(t, ctx, srv.URL, changedAt(payload, 1)))
	require.True(t, errors.Is(err, idemretry.ErrFingerprintMismatch), "got %v", err)
	assert.True(t, idemretry.IsReplay(roundTrip(t, tr, post(t, ctx, srv.URL, payload))))
	reqs := srv.requireOnePayment(t, 2)
	assert.Equal(t, key, reqs[1].Key)
}
