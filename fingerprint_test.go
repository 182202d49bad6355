package idemretry_test

// The request fingerprint guards guarantee 9 for every named action, in
// flights and in journals: a digest an attacker can collide (two CRC-32s
// were tried for speed and refused, see the crafted payloads below), or a
// definition that drifts from the one journals already hold, would hand
// one payment another's answer or strand payments left pending.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
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

// The previous release paid "pay:H" through a 307: the parent is done (the
// 307), its hop "pay:H redirect:<8 bytes of the hop's fingerprint>" was
// charged by the redirect target and its answer lost. The upgraded app
// sends pay:H again (a named action is resent under its key): the
// parent's 307 comes back and the hop must go out under the hop's key, so
// that the target replays instead of charging again.
func TestUpgradeNamedRedirectHopKeepsItsKey(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path != "/redir" {
					return false
				}
				w.Header().Set("Location", "/pay")
				w.WriteHeader(http.StatusTemporaryRedirect)
				return true
			}
			srv.commitThenDrop = map[int]bool{1: true}
			const body = `{"order":"H","amount":1500}`
			const parentKey, hopKey = "0b7e4d8c-6a51-4a8e-9d4e-3f1f8e2d7c10", "7c2f1e9a-0d3b-4f6e-8a5c-1b2d3e4f5a60"
			hopFP := legacyFingerprint(http.MethodPost, srv.URL+"/pay", body)
			hopID := "pay:H redirect:" + fmt.Sprintf("%x", hopFP[:8])
			dir, fo, old := previousRelease(t, hashed)
			ctx := context.Background()
			parent := journal.Record{ActionID: "pay:H", Key: parentKey, Fingerprint: legacyFingerprint(http.MethodPost, srv.URL+"/redir", body),
				CreatedAt: time.Now(), State: journal.StatePending}
			_, _, err := old.Reserve(ctx, parent, journal.ReuseAny)
			require.NoError(t, err)
			parent.State, parent.Attempts, parent.Status = journal.StateDone, 1, http.StatusTemporaryRedirect
			require.NoError(t, old.Update(ctx, parent))
			_, _, err = old.Reserve(ctx, journal.Record{ActionID: hopID, Key: hopKey, Fingerprint: hopFP, CreatedAt: time.Now(), State: journal.StatePending}, journal.ReuseAny)
			require.NoError(t, err)
			chargeAndLose(t, srv.URL+"/pay", hopKey, body)
			require.NoError(t, old.Close())
			require.Equal(t, 1, srv.chargeCount())

			tr := upgraded(t, dir, fo)
			resp, err := (&http.Client{Transport: tr}).Do(post(t, idemretry.WithAction(ctx, "pay:H"), srv.URL+"/redir", body))
			require.NoError(t, err, "the upgraded app cannot resend pay:H")
			readAll(t, resp)
			reqs := srv.seen()
			assert.Equal(t, hopKey, reqs[len(reqs)-1].Key, "the hop went out under another key than the one it was charged under")
			assert.Equal(t, 1, srv.chargeCount(), "charged twice")
		})
	}
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
