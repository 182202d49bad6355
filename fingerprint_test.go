package idemretry_test

// The request fingerprint guards guarantee 9 for every named action, in
// flights and in journals: a digest an attacker can collide (two CRC-32s
// were tried for speed and refused, see the crafted payloads below), or a
// definition that drifts from the one journals already hold, would hand
// one payment another's answer or strand payments left pending.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// legacyFingerprint is the fingerprint earlier releases stored for every
// action, named or not (TestFingerprintDefinitionIsStable pins it):
// SHA-256(method 0 URL 0 SHA-256(body)).
func legacyFingerprint(method, url, body string) journal.Fingerprint {
	sum := sha256.Sum256([]byte(body))
	return sha256.Sum256([]byte(method + "\x00" + url + "\x00" + string(sum[:])))
}

// An app on the previous release paid order-3 (WithAction "pay:order-3")
// and was killed after the server charged it, before the answer came: its
// file journal holds the action pending, with its key and the fingerprint
// that release stored. The app is upgraded and restarts on the same
// journal. Resume must resend the payment under its key (the server
// replays), and so must a live resend of the same action: guarantee 2 ("one
// key per action ... across restarts") and "Resuming after a crash". The
// same for an action named by a key the caller set.
func TestUpgradeResumesNamedActionsLeftPendingByThePreviousRelease(t *testing.T) {
	t.Parallel()
	for _, hashed := range []bool{false, true} {
		for _, how := range []string{"resume", "live resend"} {
			for _, kind := range []string{"WithAction", "caller key"} {
				t.Run(fmt.Sprintf("hashed=%v/%s/%s", hashed, how, kind), func(t *testing.T) {
					srv := newPayServer(t)
					srv.commitThenDrop = map[int]bool{1: true} // charged, answer lost: the "crash"
					const body, key = `{"order":"order-3","amount":4200}`, "5d0c8d3a-2f5e-4c53-9f0e-6f1f8d1c9a11"
					id := "pay:order-3"
					if kind == "caller key" {
						id = "key:" + key
					}
					// What the previous release did before its first attempt:
					// the key durable, with the fingerprint it computed.
					dir, fo, old := previousRelease(t, hashed)
					_, created, err := old.Reserve(context.Background(), journal.Record{ActionID: id, Key: key,
						Fingerprint: legacyFingerprint(http.MethodPost, srv.URL, body), CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
					require.NoError(t, err)
					require.True(t, created)
					// Its attempt, charged by the server, answer lost.
					chargeAndLose(t, srv.URL, key, body)
					require.NoError(t, old.Close())
					require.Equal(t, 1, srv.chargeCount())

					tr := upgraded(t, dir, fo)
					var status int
					var sendErr error
					switch how {
					case "resume":
						recs, err := tr.Journal().Unfinished(context.Background())
						require.NoError(t, err)
						require.Len(t, recs, 1)
						app := &appResumer{url: srv.URL, orders: map[string]string{recs[0].ActionID: body}}
						results, err := tr.Resume(context.Background(), app, 0)
						require.NoError(t, err)
						require.Len(t, results, 1)
						status, sendErr = results[0].Status, results[0].Err
					case "live resend":
						req := post(t, idemretry.WithAction(context.Background(), "pay:order-3"), srv.URL, body)
						if kind == "caller key" {
							req = post(t, context.Background(), srv.URL, body)
							req.Header.Set("Idempotency-Key", key)
						}
						resp, err := tr.RoundTrip(req)
						if err == nil {
							readAll(t, resp)
							status = resp.StatusCode
						}
						sendErr = err
					}
					require.NoError(t, sendErr, "the upgraded app cannot resend the payment the previous release left pending")
					assert.Equal(t, http.StatusCreated, status)
					reqs := srv.seen()
					require.Len(t, reqs, 2)
					assert.Equal(t, key, reqs[1].Key, "resent under the key it was charged under")
					assert.Equal(t, 1, srv.chargeCount())
				})
			}
		}
	}
}

// crcCollision returns a body of the same length as a, made from b by
// rewriting the bytes of b's memo (the run of 'A's at memo) to 'A's and
// 'C's, whose CRC-32C and CRC-32 (IEEE) are a's: a digest a fingerprint
// must not rely on. CRCs are affine in the message, so this is a 64x64
// linear system over GF(2); it takes microseconds.
func crcCollision(t *testing.T, a, b []byte, memo, n int) []byte {
	t.Helper()
	require.Equal(t, len(a), len(b))
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	crc := func(p []byte) uint64 {
		return uint64(crc32.Checksum(p, castagnoli))<<32 | uint64(crc32.ChecksumIEEE(p))
	}
	zero := crc(make([]byte, len(b)))
	// Column i: what flipping 'A' (0x41) to 'C' (0x43) at memo+i does (a
	// one-bit change: CRC-32C's polynomial has the factor x+1, so changes
	// of even weight alone cannot reach every CRC pair).
	cols := make([]uint64, n)
	for i := range n {
		e := make([]byte, len(b))
		e[memo+i] = 0x41 ^ 0x43
		cols[i] = crc(e) ^ zero
	}
	target := crc(a) ^ crc(b)
	// Gaussian elimination: keep, per pivot bit, a combination of columns.
	type row struct {
		v    uint64
		used []bool
	}
	var basis [64]*row
	for i, c := range cols {
		r := &row{v: c, used: make([]bool, n)}
		r.used[i] = true
		for bit := 63; bit >= 0; bit-- {
			if r.v>>uint(bit)&1 == 0 {
				continue
			}
			if basis[bit] == nil {
				basis[bit] = r
				break
			}
			r.v ^= basis[bit].v
			for k := range r.used {
				r.used[k] = r.used[k] != basis[bit].used[k]
			}
		}
	}
	sel := make([]bool, n)
	for bit := 63; bit >= 0; bit-- {
		if target>>uint(bit)&1 == 0 {
			continue
		}
		require.NotNil(t, basis[bit], "columns do not span bit %d", bit)
		target ^= basis[bit].v
		for k := range sel {
			sel[k] = sel[k] != basis[bit].used[k]
		}
	}
	out := append([]byte(nil), b...)
	for i, s := range sel {
		if s {
			out[memo+i] = 'C'
		}
	}
	require.Equal(t, crc(a), crc(out))
	require.NotEqual(t, a, out)
	return out
}

// topUps are two payments of one named action, of the same length: the
// first charges 10.00, the second 99999.00 with a memo the user typed,
// crafted in microseconds so that both have one CRC pair.
func topUps(t *testing.T) (first, second []byte) {
	t.Helper()
	memo := strings.Repeat("A", 96)
	first = []byte(`{"wallet":"u-7","amount_cents":"0000001000","memo":"` + memo + `"}`)
	plain := []byte(`{"wallet":"u-7","amount_cents":"0009999900","memo":"` + memo + `"}`)
	second = crcCollision(t, first, plain, bytes.Index(plain, []byte(memo)), len(memo))
	t.Logf("first  %s\nsecond %s (same length, CRC-32C and CRC-32)", first, second)
	return first, second
}

// A request that joins a named action's flight with another payload must
// be refused (guarantee 9: "An action id ... reused with a different ...
// body fails with ErrFingerprintMismatch before anything is sent, whether
// the first request is in flight or recorded"). A body crafted to the first's
// CRC pair would, with a CRC check, join the flight and be handed a copy of
// the first payload's answer: never sent, so no server-side payload check
// could catch it.
func TestNamedFlightJoinerWithAnotherPayloadIsRefused(t *testing.T) {
	first, second := topUps(t)
	srv := newSlowPayServer(t, 300*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "topup:u-7:session-1")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, string(first)))
		if assert.NoError(t, err) {
			readAll(t, resp)
		}
	}()
	<-srv.arrived // the first payload is in flight
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, string(second)))
	var got string
	if err == nil {
		got = fmt.Sprintf("%d %s", resp.StatusCode, readAll(t, resp))
	}
	wg.Wait()
	assert.Len(t, srv.seen(), 1)
	require.True(t, errors.Is(err, idemretry.ErrFingerprintMismatch),
		"the 99999.00 top-up was given the 10.00 top-up's answer (%q), err %v; the server saw only the first payload", got, err)
}

// The same action id reused, after the first payment is done, with another
// payload of the same CRC pair: sent under the first payment's key, and a
// server that does not compare payloads (the payServer here, like many
// providers and the IETF draft's "SHOULD") replays the 10.00 answer as the
// 99999.00 payment's. It must fail with ErrFingerprintMismatch with nothing
// sent.
func TestNamedActionReusedWithCraftedPayloadIsRefused(t *testing.T) {
	first, second := topUps(t)
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "topup:u-7:session-1")
	roundTrip(t, tr, post(t, ctx, srv.URL, string(first)))
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, string(second)))
	var got string
	if err == nil {
		got = fmt.Sprintf("%d %s replayed=%v", resp.StatusCode, readAll(t, resp), idemretry.IsReplay(resp))
	}
	require.True(t, errors.Is(err, idemretry.ErrFingerprintMismatch),
		"another payload under the action's key: got %q, err %v; the server saw %d requests", got, err, len(srv.seen()))
}

// Over HTTP: a named action streamed from GetBody (8 MiB) and reused with
// only its last byte changed fails with ErrFingerprintMismatch and sends
// nothing, while its exact repeat goes out under the same key.
func TestNamedActionLastByteChangedIsRefused(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true } // not final: stays pending
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<19)
	send := func(p []byte) error {
		req, err := http.NewRequestWithContext(idemretry.WithAction(context.Background(), "pay:large"), http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(p)), nil }
		req.Body, _ = req.GetBody()
		req.ContentLength = int64(len(p))
		return sendErr(tr, req)
	}
	require.NoError(t, send(payload))
	changed := append([]byte(nil), payload...)
	changed[len(changed)-1] ^= 0x20
	require.ErrorIs(t, send(changed), idemretry.ErrFingerprintMismatch)
	require.Len(t, srv.seen(), 1, "the changed payload was not sent")
	require.NoError(t, send(payload))
	keys := keysOf(srv.seen())
	require.Len(t, keys, 2)
	assert.Equal(t, keys[0], keys[1], "the exact repeat went out under the first key")
}

// previousRelease opens a new file journal (with hashed ids if asked), as
// an earlier release had it, for a test to write that release's records.
func previousRelease(t *testing.T, hashed bool) (dir string, fo []filejournal.Option, old *filejournal.Journal) {
	t.Helper()
	dir = t.TempDir()
	if hashed {
		fo = append(fo, filejournal.WithHashedIDs())
	}
	old, err := filejournal.Open(dir, fo...)
	require.NoError(t, err)
	return dir, fo, old
}

// chargeAndLose sends body to url under key by hand, as an attempt of the
// earlier release: the server charges it and its answer is lost.
func chargeAndLose(t *testing.T, url, key, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	if resp, err := (&http.Client{}).Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the attempt's answer was not lost")
	}
}

// upgraded is the upgraded app: a Transport on the journal the earlier
// release left in dir, closed with the test.
func upgraded(t *testing.T, dir string, fo []filejournal.Option) *idemretry.Transport {
	t.Helper()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir, fo...), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, tr.Close()) })
	return tr
}

// A named action's body of KeyedMinBody bytes or more gets a keyed
// fingerprint (fingerprint.go): each new record draws its own salt, so every other request of the
// action (a double tap, a resend after a restart, Resume's rebuilt one, a
// Transport of another process) is checked by computing its fingerprint
// with the record's or the leader's secret. These tests hold it to
// guarantees 2 and 9 over HTTP.

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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// Review of the second hot-path pass (666b1be, 8d51a09, 2102882, b5ea642,
// 97249ff): attempts through an *http.Transport without a cancel of their
// own, the flight's attempt trace, the fingerprint read in place, the
// journal bound without a timer, the header copied in one pass. Real
// loopback HTTP.

// fpJournal is a journal.Memory that keeps the fingerprint of every
// record it is asked to reserve.
type fpJournal struct {
	*journal.Memory
	mu  sync.Mutex
	fps []journal.Fingerprint
}

func (j *fpJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	j.mu.Lock()
	j.fps = append(j.fps, rec.Fingerprint)
	j.mu.Unlock()
	return j.Memory.Reserve(ctx, rec, mode)
}

func (j *fpJournal) last(t *testing.T) journal.Fingerprint {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	require.NotEmpty(t, j.fps)
	return j.fps[len(j.fps)-1]
}

// The fingerprint names unnamed actions and is stored in journals across
// restarts: it must be what it was before the in-place hashing, the
// SHA-256 of the bytes GetBody gives, for every request. http.NewRequest's
// GetBody is a snapshot taken when the request was made; a Body read or
// written to after that, or replaced, no longer holds the same bytes
// (and the retries send GetBody's). Each request here must get the
// fingerprint of a fresh request whose body is GetBody's bytes.
//
// Found in the second review of the hot-path pass (was TestReview2FingerprintIsGetBodysAfterBodyChanged).
func TestFingerprintIsGetBodysAfterBodyChanged(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	const payload = `{"amount":100,"currency":"eur"}`
	cases := map[string]func(t *testing.T) *http.Request{
		"bytes.Reader read after NewRequest": func(t *testing.T) *http.Request {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", bytes.NewReader([]byte(payload)))
			require.NoError(t, err)
			_, err = io.ReadFull(req.Body, make([]byte, 5))
			require.NoError(t, err)
			return req
		},
		"strings.Reader read after NewRequest": func(t *testing.T) *http.Request {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payload))
			require.NoError(t, err)
			_, err = io.ReadFull(req.Body, make([]byte, 5))
			require.NoError(t, err)
			return req
		},
		"bytes.Buffer written after NewRequest": func(t *testing.T) *http.Request {
			buf := bytes.NewBufferString(payload)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", buf)
			require.NoError(t, err)
			buf.WriteString(`,"extra":1`)
			return req
		},
		"Body replaced, GetBody kept": func(t *testing.T) *http.Request {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payload))
			require.NoError(t, err)
			req.Body = io.NopCloser(strings.NewReader(`{"amount":1,"currency":"eur"}`))
			return req
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			j := &fpJournal{Memory: journal.NewMemory()}
			tr := transportOver(t, j)
			ref, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(payload))
			require.NoError(t, err)
			roundTrip(t, tr, ref)
			want := j.last(t)

			req := mk(t)
			gb, err := req.GetBody()
			require.NoError(t, err)
			got, _ := io.ReadAll(gb)
			require.Equal(t, payload, string(got), "GetBody gives the request's snapshot")
			if resp, err := tr.RoundTrip(req); err == nil { // what is sent does not matter here
				resp.Body.Close()
			}
			require.Equal(t, want, j.last(t), "the fingerprint is no longer the one of GetBody's bytes")
		})
	}
}

// The same split seen by a named action: a second request of the action,
// whose GetBody gives the same payload, is the same payload (a resend
// answered from the journal), not ErrFingerprintMismatch.
//
// Found in the second review of the hot-path pass (was TestReview2NamedActionResendWithReadBodyIsSamePayload).
func TestFingerprintOfANamedResendWithReadBodyIsTheSamePayload(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	ctx := idemretry.WithAction(context.Background(), "pay:review2-read-body")
	roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":100}`))
	req := post(t, ctx, srv.URL, `{"amount":100}`)
	_, err := io.ReadFull(req.Body, make([]byte, 3)) // e.g. a logging middleware that peeked
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	require.False(t, errors.Is(err, idemretry.ErrFingerprintMismatch), "a resend of the same GetBody payload refused: %v", err)
}

// Hashing in place must not consume or move the caller's Body: with a body
// net/http can rewind, and one it cannot (read into memory), the server
// gets the whole payload on the first attempt, and the caller's reader is
// where it was.
//
// Found in the second review of the hot-path pass (was TestReview2FingerprintLeavesCallerBodyAlone).
func TestFingerprintLeavesCallerBodyAlone(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	payload := strings.Repeat("x", 5000)
	for _, name := range []string{"strings.Reader", "bytes.Reader", "bytes.Buffer", "empty", "NoBody"} {
		t.Run(name, func(t *testing.T) {
			var body io.Reader
			want := payload
			switch name {
			case "strings.Reader":
				body = strings.NewReader(payload)
			case "bytes.Reader":
				body = bytes.NewReader([]byte(payload))
			case "bytes.Buffer":
				body = bytes.NewBufferString(payload)
			case "empty":
				body, want = strings.NewReader(""), ""
			case "NoBody":
				body, want = http.NoBody, ""
			}
			req, err := http.NewRequest(http.MethodPost, srv.URL, body)
			require.NoError(t, err)
			before := *req
			hdr := req.Header.Clone()
			roundTrip(t, tr, req)
			require.Equal(t, want, got.Load())
			require.Equal(t, hdr, req.Header, "the caller's header was changed")
			require.True(t, before.Body == req.Body && before.ContentLength == req.ContentLength, "the caller's request was changed")
		})
	}
}

// Without an action id, the fingerprint finds an unfinished action (a resend
// after a crash) but not a finished one (a deliberate repeat).
func TestFingerprintMatchesPendingOnly(t *testing.T) {
	j := journal.NewMemory()
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	first, _ := newTestTransportOver(t, j, idemretry.WithMaxRetries(0))
	resp, err := first.RoundTrip(post(t, context.Background(), srv.URL, "same"))
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode)
	readAll(t, resp)

	second, _ := newTestTransportOver(t, j)
	for range 2 {
		resp, err = second.RoundTrip(post(t, context.Background(), srv.URL, "same"))
		require.NoError(t, err)
		readAll(t, resp)
	}
	keys := keysOf(srv.seen())
	require.Len(t, keys, 3)
	assert.Equal(t, keys[0], keys[1], "the pending action was resumed with its key")
	assert.NotEqual(t, keys[1], keys[2], "a repeat after completion is a new action")
	assert.Equal(t, 2, srv.chargeCount())
}

// I8: an action id reused with another body is refused before sending.
func TestFingerprintMismatchRefused(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:i8")
	roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":100}`))

	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":999}`))
	require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "pay:i8", ae.Action)
	assert.Equal(t, srv.seen()[0].Key, ae.Key)
	assert.Len(t, srv.seen(), 1, "nothing was sent")
}

// The fingerprint is stored in durable journals, so its definition must not
// drift between versions: SHA-256 of method, NUL, URL, NUL, SHA-256(body).
func TestFingerprintDefinitionIsStable(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { status(503)(w); return true }
	tr, j, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	for _, body := range []string{"", `{"amount":1}`} {
		url := srv.URL + "/v1/payments?expand=charge"
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		if body == "" {
			req.Body, req.GetBody = nil, nil
		}
		roundTrip(t, tr, req.WithContext(idemretry.WithAction(context.Background(), "pay:fp-"+body)))

		bodySum := sha256.Sum256([]byte(body))
		want := sha256.Sum256([]byte("POST\x00" + url + "\x00" + string(bodySum[:])))
		un, err := j.Unfinished(context.Background())
		require.NoError(t, err)
		var got []journal.Fingerprint
		for _, r := range un {
			if r.ActionID == "pay:fp-"+body {
				got = append(got, r.Fingerprint)
			}
		}
		assert.Equal(t, []journal.Fingerprint{want}, got, "body %q", body)
	}
}

// hS1's review of commit 175a114: the keyed fingerprint now covers a named
// action's body of 512 bytes or more (idemretry.KeyedMinBody), nearly every
// named payment. Guarantee 9 (one payload per action) and guarantee 2 (one
// key per action, a double tap sends one request) over loopback HTTP, at
// the sizes around the threshold and the chunk, for the ways an app builds
// a body.

// smallNamedSizes are the body sizes around the keyed threshold and a chunk.
var smallNamedSizes = []int{idemretry.KeyedMinBody - 1, idemretry.KeyedMinBody, idemretry.KeyedMinBody + 1, 1 << 10, 64<<10 - 1, 64 << 10, 64<<10 + 1}

// smallNamedPayload is a JSON-ish payment body of exactly n bytes.
func smallNamedPayload(order string, n int) string {
	line := `{"order":"` + order + `","amount":1000,"iban":"DE00000000000000000000"}` + "\n"
	return strings.Repeat(line, n/len(line)+1)[:n]
}

// smallNamedRequest builds a POST of p the way an app may: with GetBody and its
// length (http.NewRequest over a strings.Reader), with GetBody and an
// unknown length (the new fingerprint is then plain), or without GetBody
// (read into memory by the Transport).
func smallNamedRequest(t *testing.T, ctx context.Context, url, p, how string) *http.Request {
	t.Helper()
	var req *http.Request
	var err error
	switch how {
	case "GetBody":
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(p))
	case "GetBody, length unknown":
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(p))
		if err == nil {
			req.ContentLength = -1
		}
	case "no GetBody":
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, url, io.NopCloser(strings.NewReader(p)))
		if err == nil {
			req.ContentLength = int64(len(p))
		}
	default:
		t.Fatalf("unknown body kind %q", how)
	}
	require.NoError(t, err)
	return req
}

var smallNamedKinds = []string{"GetBody", "GetBody, length unknown", "no GetBody"}

// A named payment charged, its answer lost; the app restarts on the same
// file journal and pays again, its body built another way than the first
// time. At every size around the threshold and the chunk: the record is
// keyed exactly when the body is KeyedMinBody bytes or more and its length
// was known; the same payload goes out under the first key (replayed);
// a payload changed in its first or last byte, or one byte shorter or
// longer (across the threshold or a chunk boundary), is refused, nothing
// sent.
//
// Found in review hs1 (ebb2b86; was TestReviewHS1SmallNamedActionAcrossRestartAtTheBoundaries).
func TestSmallNamedActionAcrossRestartAtTheBoundaries(t *testing.T) {
	t.Parallel()
	for _, n := range smallNamedSizes {
		for i, first := range smallNamedKinds {
			again := smallNamedKinds[(i+1)%len(smallNamedKinds)]
			t.Run(fmt.Sprintf("%d/%s then %s", n, first, again), func(t *testing.T) {
				srv := newPayServer(t)
				srv.commitThenDrop = map[int]bool{1: true}
				id := fmt.Sprintf("pay:hs1-%d-%d", n, i)
				payload := smallNamedPayload(id, n)
				ctx := idemretry.WithAction(context.Background(), id)
				dir := t.TempDir()
				tr1, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
				require.NoError(t, err)
				_, err = tr1.RoundTrip(smallNamedRequest(t, ctx, srv.URL, payload, first))
				require.Error(t, err, "the answer was lost")
				keyedHere := idemretry.MakesKeyedFingerprints(tr1)
				require.NoError(t, tr1.Close())

				tr := upgraded(t, dir, nil)
				recs, err := tr.Journal().Unfinished(context.Background())
				require.NoError(t, err)
				require.Len(t, recs, 1)
				wantKeyed := keyedHere && n >= idemretry.KeyedMinBody && first != "GetBody, length unknown"
				assert.Equal(t, wantKeyed, bytes.Equal(keyedPrefix, recs[0].Fingerprint[:4]), "the record's form")
				if !wantKeyed {
					assert.Equal(t, legacyFingerprint(http.MethodPost, srv.URL, payload), recs[0].Fingerprint)
				}
				for _, other := range []string{changedAt(payload, 0), changedAt(payload, n-1), payload[:n-1], payload + "x"} {
					err := sendErr(tr, smallNamedRequest(t, ctx, srv.URL, other, again))
					require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "%d bytes against %d", len(other), n)
				}
				require.Len(t, srv.seen(), 1, "a changed payload was sent")
				resp := roundTrip(t, tr, smallNamedRequest(t, ctx, srv.URL, payload, again))
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.True(t, idemretry.IsReplay(resp))
				srv.requireOnePayment(t, 2)
			})
		}
	}
}

// A double tap of a small named payment, each tap's body built another
// way (so that some taps' own fingerprints are keyed, each with its own
// salt, and some plain), the leader's either: every tap of the same
// payload joins the first (one request, one charge, one answer), a tap of
// another payload is refused.
//
// Found in review hs1 (ebb2b86; was TestReviewHS1SmallNamedDoubleTapMixedForms).
func TestSmallNamedDoubleTapMixedForms(t *testing.T) {
	for _, n := range []int{idemretry.KeyedMinBody, idemretry.KeyedMinBody + 1, 1 << 10} {
		for _, leader := range smallNamedKinds {
			t.Run(fmt.Sprintf("%d/leader %s", n, leader), func(t *testing.T) {
				srv := newSlowPayServer(t, 300*time.Millisecond)
				tr, _, _ := newTestTransport(t)
				id := "pay:hs1-tap"
				payload := smallNamedPayload(id, n)
				ctx := idemretry.WithAction(context.Background(), id)
				type tapResult struct {
					body string
					err  error
				}
				taps := 1 + 2*len(smallNamedKinds)
				res := make([]tapResult, taps+1)
				var wg sync.WaitGroup
				tap := func(i int, p, how string) {
					defer wg.Done()
					resp, err := tr.RoundTrip(smallNamedRequest(t, ctx, srv.URL, p, how))
					res[i].err = err
					if err == nil {
						b, rerr := io.ReadAll(resp.Body)
						resp.Body.Close()
						res[i].body, res[i].err = string(b), rerr
					}
				}
				wg.Add(1)
				go tap(0, payload, leader)
				<-srv.arrived
				for i := 1; i < taps; i++ {
					wg.Add(1)
					go tap(i, payload, smallNamedKinds[i%len(smallNamedKinds)])
				}
				wg.Add(1)
				go tap(taps, changedAt(payload, n-1), "GetBody")
				wg.Wait()
				for i := 0; i < taps; i++ {
					require.NoError(t, res[i].err, "tap %d", i)
					assert.Equal(t, res[0].body, res[i].body, "tap %d read another answer", i)
				}
				require.ErrorIs(t, res[taps].err, idemretry.ErrFingerprintMismatch)
				assert.Len(t, srv.seen(), 1, "a tap sent a request of its own")
				assert.Equal(t, 1, srv.chargeCount())
			})
		}
	}
}

// A small named payment left pending is resumed after a restart with the
// same payload (sent under its key, replayed) or another (refused, nothing
// sent).
//
// Found in review hs1 (ebb2b86; was TestReviewHS1SmallNamedResume).
func TestSmallNamedResume(t *testing.T) {
	t.Parallel()
	for _, same := range []bool{true, false} {
		t.Run(fmt.Sprintf("same payload %v", same), func(t *testing.T) {
			srv := newPayServer(t)
			srv.commitThenDrop = map[int]bool{1: true}
			id := "pay:hs1-resume"
			payload := smallNamedPayload(id, idemretry.KeyedMinBody)
			dir := t.TempDir()
			tr1, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
			require.NoError(t, err)
			_, err = tr1.RoundTrip(post(t, idemretry.WithAction(context.Background(), id), srv.URL, payload))
			require.Error(t, err)
			require.NoError(t, tr1.Close())
			tr := upgraded(t, dir, nil)
			rebuilt := payload
			if !same {
				rebuilt = changedAt(payload, len(payload)/2)
			}
			res, err := tr.Resume(context.Background(), &appResumer{url: srv.URL, orders: map[string]string{id: rebuilt}}, 0)
			require.NoError(t, err)
			require.Len(t, res, 1)
			if same {
				require.NoError(t, res[0].Err)
				assert.Equal(t, http.StatusCreated, res[0].Status)
				srv.requireOnePayment(t, 2)
			} else {
				require.ErrorIs(t, res[0].Err, idemretry.ErrFingerprintMismatch)
				assert.Len(t, srv.seen(), 1)
			}
		})
	}
}

// Many goroutines, two Transports whose journals keep different secrets
// (each its own pool of scratch), small named payments of every size
// around the threshold: each is charged once, its resend replayed, a
// changed resend refused. A scratch lent across the keys, or state left
// in one, would refuse a resend or let a changed one through.
//
// Found in review hs1 (ebb2b86; was TestReviewHS1ConcurrentSmallNamedTwoSecrets).
func TestSmallNamedConcurrentUnderTwoSecrets(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	trs := []*idemretry.Transport{transportOver(t, journal.NewMemory()), transportOver(t, journal.NewMemory())}
	const workers, each = 12, 6
	var wg sync.WaitGroup
	errs := make(chan error, workers*each*3)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := trs[w%2]
			for i := range each {
				id := fmt.Sprintf("pay:hs1-c-%d-%d", w, i)
				n := smallNamedSizes[(w+i)%len(smallNamedSizes)]
				p := smallNamedPayload(id, n)
				ctx := idemretry.WithAction(context.Background(), id)
				for try := range 2 {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(p))
					if err != nil {
						errs <- err
						return
					}
					resp, err := tr.RoundTrip(req)
					if err != nil {
						errs <- fmt.Errorf("%s (%d bytes) try %d: %w", id, n, try, err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if try == 1 && !idemretry.IsReplay(resp) {
						errs <- fmt.Errorf("%s (%d bytes): the resend was not replayed", id, n)
					}
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(changedAt(p, n/2)))
				if err != nil {
					errs <- err
					return
				}
				if err := sendErr(tr, req); !assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch) {
					errs <- fmt.Errorf("%s (%d bytes): a changed payload was not refused", id, n)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, workers*each, srv.chargeCount())
}

// hW1's review: the keyed fingerprint (named actions, bodies of 512 bytes
// and more) at its size threshold and its 64 KiB chunk boundaries, with
// bodies read in odd pieces (GetBody's reader), buffered (no GetBody), and
// cut short by the base on the first attempt.

// boundaryRequest is a POST of body for action id: buffered (no GetBody), or
// with a GetBody whose reader yields the body in odd pieces and a known
// ContentLength.
func boundaryRequest(t *testing.T, url, id string, body []byte, getBody bool) *http.Request {
	ctx := idemretry.WithAction(context.Background(), id)
	if !getBody {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, struct{ io.Reader }{bytes.NewReader(body)})
		require.NoError(t, err)
		return req
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(iotest.HalfReader(bytes.NewReader(body))), nil
	}
	req.ContentLength = int64(len(body))
	return req
}

// Found in review hw1 (f949e43; was TestHW1KeyedFingerprintAtItsBoundaries).
func TestKeyedFingerprintAtItsBoundaries(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	for _, size := range []int{511, 512, 513, 64<<10 - 1, 64 << 10, 64<<10 + 1, 128 << 10, 128<<10 + 3} {
		for _, firstGetBody := range []bool{false, true} {
			id := fmt.Sprintf("pay:%d-%v", size, firstGetBody)
			body := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
			resp, err := tr.RoundTrip(boundaryRequest(t, srv.URL, id, body, firstGetBody))
			require.NoError(t, err)
			readAll(t, resp)
			key := resp.Request.Header.Get("Idempotency-Key")
			// The same payload, read the other way: the same action.
			resp, err = tr.RoundTrip(boundaryRequest(t, srv.URL, id, body, !firstGetBody))
			require.NoError(t, err, "size %d: the same payload refused", size)
			readAll(t, resp)
			assert.Equal(t, key, resp.Request.Header.Get("Idempotency-Key"), "size %d", size)
			assert.True(t, idemretry.IsReplay(resp), "size %d", size)
			// One byte changed, at each chunk's edge, or one byte more or
			// less: another payload.
			for _, at := range []int{0, size / 2, size - 1, 64<<10 - 1, 64 << 10} {
				if at >= size {
					continue
				}
				other := bytes.Clone(body)
				other[at] ^= 1
				_, err = tr.RoundTrip(boundaryRequest(t, srv.URL, id, other, !firstGetBody))
				assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "size %d, byte %d changed", size, at)
			}
			for _, other := range [][]byte{body[:size-1], append(bytes.Clone(body), '0')} {
				_, err = tr.RoundTrip(boundaryRequest(t, srv.URL, id, other, firstGetBody))
				assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "size %d, %d bytes", size, len(other))
			}
		}
	}
	assert.Equal(t, 16, srv.chargeCount())
}

// Adversarial review of the keyed fingerprint (fingerprint.go, commit
// b358e2b): each test holds a README guarantee over loopback HTTP.

const (
	envKeyedSecretURL = "IDEMRETRY_KEYED_SECRET_URL"
)

// keyedSecretChild runs TestKeyedSecretChild in a child process with env
// added, and returns the line it printed after "RoundTrip returned: ".
func keyedSecretChild(t *testing.T, env ...string) string {
	t.Helper()
	cmd := childtest.Command("TestKeyedSecretChild", env...)
	cmd.Args = append(cmd.Args, "-test.v")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process failed: %s", out)
	for _, line := range strings.Split(string(out), "\n") {
		if s, ok := strings.CutPrefix(line, "RoundTrip returned: "); ok {
			return s
		}
	}
	t.Fatalf("the child printed no result: %s", out)
	return ""
}

// TestKeyedSecretChild is the child process of the test below: it sends
// the large named payment of its parent with crypto/rand.Reader failing.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewKeyedChild).
func TestKeyedSecretChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("the child process of TestKeyedSecretFromAFailingRandReader")
	}
	url := os.Getenv(envKeyedSecretURL)
	j := journal.NewMemory() // its secret drawn before the reader fails
	rand.Reader = failingReader{}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:F-1"), url, largePayload("F-1")))
	if err == nil {
		resp.Body.Close()
		fmt.Println("RoundTrip returned: <nil>", resp.StatusCode)
		return
	}
	var ae *idemretry.ActionError
	fmt.Printf("RoundTrip returned: %v (ActionError %t, MaybeProcessed %t)\n", err, errors.As(err, &ae), ae != nil && ae.MaybeProcessed)
}

// crypto/rand.Reader failing when a large named body draws its
// fingerprint's secret: an error, nothing sent, no crash, prefixed once.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewKeyedSecretFailingRandReader).
func TestKeyedSecretFromAFailingRandReader(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	got := keyedSecretChild(t, envKeyedSecretURL+"="+srv.URL)
	t.Logf("child: %s", got)
	assert.Equal(t, 1, strings.Count(got, "idemretry: "), "the error carries the prefix once: %s", got)
	assert.NotContains(t, got, "<nil>")
	assert.Empty(t, srv.seen(), "nothing was sent")
}

// A large named payment left pending (keyed record, secret s1) in a file
// journal that hashes ids; restarted, the app resumes it while it also
// pays it live (its own secret s2), in either order: the two share one
// flight (guarantee 2: a double tap sends one request), one charge under
// the record's key, both answered.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedResumeAndLiveShareOneFlightHashedIDs).
func TestLargeNamedResumeAndLiveShareOneFlightHashedIDs(t *testing.T) {
	t.Parallel()
	type tc struct {
		first, size string
		hashed      bool
	}
	var cases []tc
	for _, hashed := range []bool{false, true} {
		for _, size := range []string{"large", "small"} {
			for _, first := range []string{"resume", "live"} {
				cases = append(cases, tc{first, size, hashed})
			}
		}
	}
	for _, c := range cases {
		first := c.first
		t.Run(fmt.Sprintf("%s first/%s/hashed=%v", first, c.size, c.hashed), func(t *testing.T) {
			srv := newSlowPayServer(t, 0)
			srv.commitThenDrop = map[int]bool{1: true}
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				if n > 1 {
					time.Sleep(600 * time.Millisecond) // the replay is slow too
				}
				return false
			}
			payload := largePayload("HR-1")
			if c.size == "small" {
				payload = payload[:idemretry.KeyedMinBody-1]
			}
			ctx := idemretry.WithAction(context.Background(), "pay:HR-1")
			dir, fo, old := previousRelease(t, c.hashed)
			require.NoError(t, old.Close())
			before, err := idemretry.NewTransport(&http.Transport{DisableKeepAlives: true}, idemretry.WithJournalDir(dir, fo...), idemretry.WithMaxRetries(0))
			require.NoError(t, err)
			_, err = before.RoundTrip(post(t, ctx, srv.URL, payload))
			require.Error(t, err, "the answer was lost")
			require.NoError(t, before.Close())
			<-srv.arrived

			tr := upgraded(t, dir, fo)
			app := &appResumer{url: srv.URL, orders: map[string]string{}}
			recs, err := tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			require.Len(t, recs, 1)
			require.Equal(t, c.size == "large" && idemretry.MakesKeyedFingerprints(tr), string(keyedPrefix) == string(recs[0].Fingerprint[:4]))
			app.orders[recs[0].ActionID] = payload // the app's own record, by the listed (hashed) id

			var res <-chan resumed
			var live <-chan error
			if first == "resume" {
				res = resumeAsync(context.Background(), tr, app, 0)
				<-srv.arrived
				live = sendAsync(tr, post(t, ctx, srv.URL, payload))
			} else {
				live = sendAsync(tr, post(t, ctx, srv.URL, payload))
				<-srv.arrived
				res = resumeAsync(context.Background(), tr, app, 0)
			}
			require.NoError(t, <-live)
			r := <-res
			require.NoError(t, r.err)
			require.Len(t, r.res, 1)
			require.NoError(t, r.res[0].Err)
			srv.requireOnePayment(t, 2)
		})
	}
}

// Guarantee 9 for the keyed form's other inputs: the same large body under
// the same named action, with another URL (path or query) or method, is
// another payload, refused with nothing sent, whether the first request is
// recorded or still in flight (a joiner).
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedActionOtherURLOrMethodIsRefused).
func TestLargeNamedActionOtherURLOrMethodIsRefused(t *testing.T) {
	t.Parallel()
	srv := newSlowPayServer(t, 300*time.Millisecond)
	payload := largePayload("U-1")
	ctx := idemretry.WithAction(context.Background(), "pay:U-1")
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(0))
	others := func() []*http.Request {
		put := post(t, ctx, srv.URL+"/v1/charges", payload)
		put.Method = http.MethodPatch
		return []*http.Request{
			post(t, ctx, srv.URL+"/v1/charges?amount=2", payload),
			post(t, ctx, srv.URL+"/v1/charge", payload),
			put,
		}
	}
	live := sendAsync(tr, post(t, ctx, srv.URL+"/v1/charges", payload))
	<-srv.arrived
	for i, r := range others() { // in flight: joiners
		require.ErrorIs(t, sendErr(tr, r), idemretry.ErrFingerprintMismatch, "joiner %d", i)
	}
	require.NoError(t, <-live)
	for i, r := range others() { // recorded
		require.ErrorIs(t, sendErr(tr, r), idemretry.ErrFingerprintMismatch, "resend %d", i)
	}
	assert.Len(t, srv.seen(), 1, "another payload was sent")
}

// The leader of a large named payment (its own secret) gives up for its
// own context while a tap of unknown length (plain form, checked in the
// leader's keyed form to join) waits: the tap carries the action on under
// the same key (guarantee 2), one charge, and is answered.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedJoinerCarriesOnAfterTheLeaderGaveUp).
func TestLargeNamedJoinerCarriesOnAfterTheLeaderGaveUp(t *testing.T) {
	t.Parallel()
	srv := newSlowPayServer(t, 0)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			<-release // the leader's attempt hangs until its caller gives up
		}
		return false
	}
	payload := largePayload("A-1")
	ctx := idemretry.WithAction(context.Background(), "pay:A-1")
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(3))
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leader := sendAsync(tr, post(t, lctx, srv.URL, payload))
	<-srv.arrived
	tap := post(t, ctx, srv.URL, payload)
	tap.ContentLength = -1 // its length unknown: a plain fingerprint
	joiner := sendAsync(tr, tap)
	time.Sleep(200 * time.Millisecond) // the tap joins (ordering only)
	cancel()
	require.Error(t, <-leader, "the leader's context ended")
	require.NoError(t, <-joiner, "the tap carried the action on")
	releaseOnce.Do(func() { close(release) })
	reqs := srv.seen()
	require.Len(t, reqs, 2, "the tap sent the action again")
	assert.Equal(t, reqs[0].Key, reqs[1].Key, "under another key")
	assert.Equal(t, 1, srv.chargeCount())
	recs, err := tr.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	assert.Empty(t, recs, "the action is done")
}

// A large named payment charged, its answer lost (pending, keyed record).
// The app sends it again with a GetBody that works for the new request's
// own fingerprint and fails on the next call (the check in the record's
// form: a file removed meanwhile, say). The action exists and may have
// been charged: the error must be an *ActionError naming it with
// MaybeProcessed (README "Errors": MaybeProcessed is false only when no
// attempt, in this run or an earlier one, can have reached the server),
// not a bare error an app takes for "nothing happened".
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedResendGetBodyFailingOnTheCheckIsAnActionError).
func TestLargeNamedResendGetBodyFailingOnTheCheckIsAnActionError(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	payload := largePayload("G-1")
	ctx := idemretry.WithAction(context.Background(), "pay:G-1")
	j := journal.NewMemory()
	leftPending(t, j, post(t, ctx, srv.URL, payload))
	tr := transportOver(t, j, idemretry.WithMaxRetries(0))
	if !idemretry.MakesKeyedFingerprints(tr) {
		// The record is plain, as is the resend's fingerprint: they are
		// compared as they are, and GetBody is never called a second time.
		t.Skip("this process makes no keyed fingerprints (no AES instructions, or fips140=only): no check in the record's form")
	}

	req, gone := secondGetBodyFails(post(t, ctx, srv.URL, payload))
	requireCheckFailed(t, sendErr(tr, req), gone, "pay:G-1")
	assert.Len(t, srv.seen(), 1, "nothing more was sent")
}

// secondGetBodyFails makes req's GetBody fail from its second call on,
// with the error it returns: an upload whose file is gone once the first
// copy was read.
func secondGetBodyFails(req *http.Request) (*http.Request, error) {
	gone := errors.New("the upload's file was removed")
	calls := 0
	getBody := req.GetBody
	req.GetBody = func() (io.ReadCloser, error) {
		if calls++; calls > 1 {
			return nil, gone
		}
		return getBody()
	}
	return req, gone
}

// requireCheckFailed requires err to be the failed check of a request
// against its action's keyed fingerprint: an *ActionError for action, with
// MaybeProcessed, wrapping cause, prefixed once.
func requireCheckFailed(t *testing.T, err, cause error, action string) {
	t.Helper()
	require.ErrorIs(t, err, cause)
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), "prefixed once: %v", err)
	var ae *idemretry.ActionError
	require.True(t, errors.As(err, &ae), "a bare error for an action that exists or is in flight: %v", err)
	assert.True(t, ae.MaybeProcessed)
	assert.Equal(t, action, ae.Action)
}

// The same for a tap of a large named payment in flight: its check in the
// leader's form fails (GetBody, on its second call); the action is in the
// air, so the error is an *ActionError with MaybeProcessed.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewLargeNamedTapGetBodyFailingOnTheCheckIsAnActionError).
func TestLargeNamedTapGetBodyFailingOnTheCheckIsAnActionError(t *testing.T) {
	t.Parallel()
	srv := newSlowPayServer(t, 300*time.Millisecond)
	payload := largePayload("G-2")
	ctx := idemretry.WithAction(context.Background(), "pay:G-2")
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(0))
	if !idemretry.MakesKeyedFingerprints(tr) {
		t.Skip("this process makes no keyed fingerprints (no AES instructions, or fips140=only): the tap is compared with the leader's plain fingerprint as it is")
	}
	leader := sendAsync(tr, post(t, ctx, srv.URL, payload))
	<-srv.arrived
	req, gone := secondGetBodyFails(post(t, ctx, srv.URL, payload))
	err := sendErr(tr, req)
	require.NoError(t, <-leader)
	requireCheckFailed(t, err, gone, "pay:G-2")
	assert.Len(t, srv.seen(), 1, "the tap sent a request")
}

// The file journal's fingerprint secret across a restart, over loopback
// HTTP: a large named payment (its fingerprint keyed under fingerprint.key)
// is charged and its answer lost while a child process sends it; the child
// is SIGKILLed; a new Transport on the same directory resends it under the
// same key, or, when fingerprint.key is gone or damaged, refuses it with
// nothing sent.

const (
	envSecretDir = "IDEMRETRY_SECRET_DIR"
	envSecretURL = "IDEMRETRY_SECRET_URL"
	secretAction = "pay:big-order-7"
)

// secretBody is the large payment body: 96 KiB, over the keyed threshold.
var secretBody = bytes.Repeat([]byte(`{"amount":1000,"note":"x"}`), 96<<10/26+1)

func secretRequest(t testing.TB, ctx context.Context, url string) *http.Request {
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, secretAction), http.MethodPost, url+"/charges", bytes.NewReader(secretBody))
	require.NoError(t, err)
	require.EqualValues(t, len(secretBody), req.ContentLength)
	return req
}

// TestSecretRestartChild is the child of TestSecretRestart*: it pays the
// large order through a Transport on the journal in envSecretDir. The
// parent kills it once the server has committed the charge.
func TestSecretRestartChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestSecretRestart")
	}
	dir := os.Getenv(envSecretDir)
	tr, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournalDir(dir))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	fmt.Println("sending")
	resp, err := tr.RoundTrip(secretRequest(t, context.Background(), os.Getenv(envSecretURL)))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(4)
	}
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode) // the parent kills before this
	os.Exit(0)
}

// secretLedger is the shared payment server (internal/paytest) that holds
// the first answer of each key until the client is gone (the answer lost
// after the commit), and replays after.
type secretLedger struct {
	*paytest.Server
	committed chan struct{}
}

func (l *secretLedger) seen() (keys []string, charges int) {
	for _, r := range l.Requests() {
		if !bytes.Equal(r.Body, secretBody) {
			panic("a body arrived changed")
		}
		keys = append(keys, r.Header.Get(paytest.KeyHeader))
	}
	return keys, len(l.Charges())
}

// chargeAndKill runs the child until the server committed its charge, then
// SIGKILLs it. It returns the key the charge was made under.
func chargeAndKill(t *testing.T, dir string, l *secretLedger, url string) string {
	t.Helper()
	cmd, out := childtest.Start(t, "TestSecretRestartChild", envSecretDir+"="+dir, envSecretURL+"="+url)
	go func() { _, _ = io.Copy(io.Discard, bufio.NewReader(out)) }()
	select {
	case <-l.committed:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the child's payment never reached the server")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	keys, charges := l.seen()
	require.Len(t, keys, 1)
	require.NotEmpty(t, keys[0])
	require.Equal(t, 1, charges)
	// The record's fingerprint is keyed (magic "irk\x01"), unless this CPU
	// lacks AES-GCM in hardware (then plain SHA-256: nothing to test).
	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.Len(t, un, 1)
	require.Equal(t, keys[0], un[0].Key)
	if string(un[0].Fingerprint[:4]) != "irk\x01" {
		t.Skip("this CPU makes plain fingerprints (no AES-GCM in hardware)")
	}
	return keys[0]
}

func newSecretLedger(t *testing.T) (*secretLedger, string) {
	l := &secretLedger{committed: make(chan struct{}, 1)}
	l.Server = paytest.New(paytest.WithAfterCharge(func(_ int, _ http.ResponseWriter, r *http.Request) bool {
		l.committed <- struct{}{}
		<-r.Context().Done()
		return true
	}))
	srv := newServer(t, l.ServeHTTP)
	return l, srv.URL
}

// secretResumer rebuilds the large order.
type secretResumer struct {
	t   *testing.T
	url string
}

func (r secretResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return secretRequest(r.t, ctx, r.url), nil
}

func (r secretResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

func TestSecretRestartResends(t *testing.T) {
	t.Parallel()
	l, url := newSecretLedger(t)
	dir := t.TempDir()
	key := chargeAndKill(t, dir, l, url)
	_, err := os.Stat(filepath.Join(dir, "fingerprint.key"))
	require.NoError(t, err)

	tr, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(secretRequest(t, context.Background(), url))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, idemretry.IsReplay(resp))
	keys, charges := l.seen()
	require.Equal(t, []string{key, key}, keys)
	require.Equal(t, 1, charges)
}

// requireUncheckable checks an *ActionError refusing the resend of the
// action charged under key.
func requireUncheckable(t *testing.T, err error, key string) {
	t.Helper()
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.True(t, ae.MaybeProcessed)
	require.Equal(t, key, ae.Key)
	require.Equal(t, secretAction, ae.Action)
	require.Contains(t, err.Error(), "cannot be checked")
	require.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), err.Error())
}

func testSecretRestartRefused(t *testing.T, damage func(path string)) *bytes.Buffer {
	l, url := newSecretLedger(t)
	dir := t.TempDir()
	key := chargeAndKill(t, dir, l, url)
	damage(filepath.Join(dir, "fingerprint.key"))

	var logs bytes.Buffer
	tr, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournalDir(dir),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(secretRequest(t, context.Background(), url))
	if resp != nil {
		resp.Body.Close()
	}
	require.Nil(t, resp)
	requireUncheckable(t, err, key)

	res, err := tr.Resume(context.Background(), secretResumer{t, url}, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, secretAction, res[0].Record.ActionID)
	require.False(t, res[0].Sent)
	requireUncheckable(t, res[0].Err, key)

	keys, charges := l.seen()
	require.Equal(t, []string{key}, keys, "something was sent")
	require.Equal(t, 1, charges)
	return &logs
}

func TestSecretRestartKeyDeleted(t *testing.T) {
	t.Parallel()
	logs := testSecretRestartRefused(t, func(path string) { require.NoError(t, os.Remove(path)) })
	require.Contains(t, logs.String(), "made a fingerprint secret for a journal that holds records",
		"NewTransport did not warn of a secret made anew:\n%s", logs.String())
}

func TestSecretRestartKeyDamaged(t *testing.T) {
	t.Parallel()
	var path string
	logs := testSecretRestartRefused(t, func(p string) {
		path = p
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		b[40] ^= 0x04 // in the secret
		require.NoError(t, os.WriteFile(p, b, 0o600))
	})
	require.Contains(t, logs.String(), "fingerprint", "NewTransport did not log the missing fingerprint secret:\n%s", logs.String())
	require.Contains(t, logs.String(), path)
}

// syncWriter serialises a logger's writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// A GetBody whose copies differ from the one the fingerprint read (a
// buffer written to after the request was made, a file rewritten) must
// not put other bytes on the wire under the action's key: the attempt
// that would send them is refused with ErrFingerprintMismatch, and the
// server never gets a complete body other than the fingerprinted one.
func TestGetBodyGivingOtherBytesIsNeverSentUnderTheKey(t *testing.T) {
	for _, name := range []string{"first attempt", "retry"} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			if name == "retry" {
				srv.script = scriptFirst(status(http.StatusServiceUnavailable))
			}
			tr, _, _ := newTestTransport(t, idemretry.WithBackOff(constant(0)))
			const payload = `{"amount":100}`
			calls := 0
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(payload))
			require.NoError(t, err)
			flip := 1 // the GetBody call from which the bytes change
			if name == "retry" {
				flip = 2
			}
			req.GetBody = func() (io.ReadCloser, error) {
				calls++
				if calls > flip {
					return io.NopCloser(strings.NewReader(`{"amount":999}`)), nil
				}
				return io.NopCloser(strings.NewReader(payload)), nil
			}
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			for _, r := range srv.pay.Requests() {
				require.Equalf(t, payload, string(r.Body), "request %d went out with other bytes than the fingerprint's", r.N)
			}
			require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
		})
	}
}

// A GetBody that fails when an attempt asks for its copy (the fingerprint
// read one) sends nothing and says so: a typed error, not an outcome the
// caller must guess at.
func TestGetBodyFailingOnTheFirstAttemptSendsNothing(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t)
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	tracked := &closeTracker{Reader: req.Body}
	req.Body = tracked
	calls := 0
	req.GetBody = func() (io.ReadCloser, error) {
		calls++
		if calls > 1 {
			return nil, errors.New("file gone")
		}
		return io.NopCloser(strings.NewReader(`{"amount":100}`)), nil
	}
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	require.Zero(t, len(srv.pay.Requests()), "nothing reached the server")
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.False(t, ae.MaybeProcessed, "nothing was sent: %v", err)
	require.True(t, tracked.isClosed(), "the caller's Body is closed")
}

// net/http resends a request with an Idempotency-Key by itself, through
// the request's GetBody, when a reused connection dies before the answer
// (the request is replayable to it). That resend's copy is checked too:
// the attempt's GetBody is the checked one, not the caller's.
func TestGetBodyGivingOtherBytesIsNeverSentByNetHTTPsOwnResend(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 2 { // the POST, on the warm-up's connection
			hijackAndClose(w)
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
	roundTrip(t, tr, httptestGet(t, srv.URL+"/warm-up"))
	const payload = `{"amount":100}`
	calls := 0
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(payload))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) {
		calls++
		if calls > 2 { // the fingerprint's, the attempt's, then net/http's own
			return io.NopCloser(strings.NewReader(`{"amount":999}`)), nil
		}
		return io.NopCloser(strings.NewReader(payload)), nil
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	for _, r := range srv.pay.Requests() {
		if r.Method == http.MethodPost {
			require.Equalf(t, payload, string(r.Body), "request %d went out with other bytes than the fingerprint's (GetBody called %d times)", r.N, calls)
		}
	}
	require.Equal(t, 3, calls, "GetBody calls: the fingerprint's, the attempt's, net/http's own resend's")
	require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
}

// closeCounter counts its Closes.
type closeCounter struct {
	io.Reader
	n atomic.Int32
}

func (c *closeCounter) Close() error { c.n.Add(1); return nil }

// The caller's Body, unsent once the fingerprint read a GetBody copy, is
// closed exactly once whichever way RoundTrip ends: answered, a copy
// with other bytes, a copy that fails, a copy that stalls past the
// deadline, a joiner that takes the leader's answer.
func TestGetBodyCallersBodyClosedOnceOnEveryPath(t *testing.T) {
	const payload = `{"amount":100}`
	good := func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(payload)), nil }
	for _, c := range []struct {
		name    string
		getBody func(calls int) (io.ReadCloser, error)
		timeout time.Duration
	}{
		{"answered", func(int) (io.ReadCloser, error) { return good() }, 0},
		{"other bytes", func(calls int) (io.ReadCloser, error) {
			if calls > 1 {
				return io.NopCloser(strings.NewReader(`{"amount":999}`)), nil
			}
			return good()
		}, 0},
		{"copy fails", func(calls int) (io.ReadCloser, error) {
			if calls > 1 {
				return nil, errors.New("file gone")
			}
			return good()
		}, 0},
		{"copy stalls", func(int) (io.ReadCloser, error) {
			pr, _ := io.Pipe() // never written: closed when the deadline ends the read
			return pr, nil
		}, 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newPayServer(t)
			tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(0))
			ctx := context.Background()
			if c.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.timeout)
				defer cancel()
			}
			req := post(t, ctx, srv.URL, payload)
			body := &closeCounter{Reader: req.Body}
			req.Body = body
			var calls atomic.Int32
			req.GetBody = func() (io.ReadCloser, error) { return c.getBody(int(calls.Add(1))) }
			resp, err := tr.RoundTrip(req)
			if err == nil {
				readAll(t, resp)
			}
			assert.Equal(t, int32(1), body.n.Load(), "the caller's Body closed once (RoundTrip: %v)", err)
		})
	}
	t.Run("joiner", func(t *testing.T) {
		srv := newPayServer(t)
		arrived, release := holdRequest(t, srv, 1)
		tr, _, _ := newTestTransport(t)
		var bodies []*closeCounter
		send := func() <-chan paid {
			req := post(t, context.Background(), srv.URL, payload)
			b := &closeCounter{Reader: req.Body}
			bodies = append(bodies, b)
			req.Body, req.GetBody = b, good
			return payAsync(tr, req)
		}
		first := send()
		<-arrived
		second := send()
		awaitJoiners(t, tr, 1)
		release()
		require.NoError(t, (<-first).err)
		require.NoError(t, (<-second).err)
		for i, b := range bodies {
			assert.Equalf(t, int32(1), b.n.Load(), "caller %d's Body closed once", i+1)
		}
	})
}

// writeCounter is a net.Conn that counts its Write calls.
type writeCounter struct {
	net.Conn
	writes *atomic.Int32
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A keyed POST whose GetBody copy is in memory (http.NewRequest's, of a
// *strings.Reader, *bytes.Reader or *bytes.Buffer) is checked against the
// fingerprint's bytes in place and handed to net/http as it is: net/http
// writes the headers and such a body in one write, where a reader it does
// not know to be in memory gets its headers flushed first (two writes).
// Before: every checked copy was streamed through a wrapper (two writes).
func TestInMemoryBodyIsWrittenInOneWrite(t *testing.T) {
	const payload = `{"amount":100}`
	for name, body := range map[string]func() io.Reader{
		"strings.Reader": func() io.Reader { return strings.NewReader(payload) },
		"bytes.Reader":   func() io.Reader { return bytes.NewReader([]byte(payload)) },
		"bytes.Buffer":   func() io.Reader { return bytes.NewBufferString(payload) },
	} {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			var writes atomic.Int32
			var d net.Dialer
			base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return writeCounter{Conn: c, writes: &writes}, nil
			}}
			tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()))
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, tr.Close())
				base.CloseIdleConnections()
				checkNoPackageGoroutines(t)
			})
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", body())
			require.NoError(t, err)
			require.NotNil(t, req.GetBody)
			roundTrip(t, tr, req)
			reqs := srv.pay.Requests()
			require.Len(t, reqs, 1)
			require.Equal(t, payload, string(reqs[0].Body))
			require.NotEmpty(t, reqs[0].Header.Get("Idempotency-Key"), "the POST was sent under a key")
			require.Equal(t, int32(1), writes.Load(), "writes of the request to its connection")
		})
	}
}
