package idemretry_test

// The keyed fingerprint over HTTP across platforms and against a forger
// who reads the journal's records: a record made by a machine that uses
// the keyed form, met by a process under GODEBUG=fips140=only (AES-GCM
// refused, so the record cannot be checked there); a body forged from the
// record's bytes; and the keyed form's tests run where new fingerprints
// are plain. Ported from the review of hF2.

import (
	"context"
	"crypto/aes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

const (
	envPlatformFIPSDir = "IDEMRETRY_PLATFORM_FIPS_DIR"
	envPlatformFIPSURL = "IDEMRETRY_PLATFORM_FIPS_URL"
)

// A large named payment charged, its answer lost, its record keyed. The
// app restarts with GODEBUG=fips140=only and pays again: the record cannot
// be checked there. Nothing may be sent, and the error must be one the
// caller can act on like any other refusal of a recorded action: an
// *ActionError with the action's key and MaybeProcessed (the server may
// have charged), its text with the "idemretry: " prefix once. By a live
// resend and by Resume.
func TestKeyedRecordMetUnderFIPS140Only(t *testing.T) {
	t.Parallel()
	if childtest.IsChild() {
		dir := os.Getenv(envPlatformFIPSDir)
		tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
		require.NoError(t, err)
		defer tr.Close()
		require.False(t, idemretry.MakesKeyedFingerprints(tr))
		ctx := idemretry.WithAction(context.Background(), "pay:F-1")
		err = sendErr(tr, post(t, ctx, os.Getenv(envPlatformFIPSURL), largePayload("F-1")))
		require.Error(t, err)
		fmt.Printf("RoundTrip under fips140=only: %v\n", err)
		assert.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), "the prefix once: %q", err)
		var ae *idemretry.ActionError
		if assert.True(t, errors.As(err, &ae), "not an *ActionError: %T %v", err, err) {
			assert.NotEmpty(t, ae.Key, "the action's key")
			assert.True(t, ae.MaybeProcessed)
		}
		// Resume's rebuilt request alike.
		app := &appResumer{url: os.Getenv(envPlatformFIPSURL), orders: map[string]string{"pay:F-1": largePayload("F-1")}}
		res, err := tr.Resume(context.Background(), app, 0)
		require.NoError(t, err)
		require.Len(t, res, 1)
		fmt.Printf("Resume under fips140=only: %v\n", res[0].Err)
		require.Error(t, res[0].Err)
		assert.Equal(t, 1, strings.Count(res[0].Err.Error(), "idemretry: "), "the prefix once: %q", res[0].Err)
		if assert.True(t, errors.As(res[0].Err, &ae), "not an *ActionError: %T %v", res[0].Err, res[0].Err) {
			assert.NotEmpty(t, ae.Key, "the action's key")
			assert.True(t, ae.MaybeProcessed)
		}
		return
	}
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	dir := t.TempDir()
	first, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	_, err = first.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:F-1"), srv.URL, largePayload("F-1")))
	require.Error(t, err, "the answer was lost")
	recs, err := first.Journal().Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	keyed := idemretry.MakesKeyedFingerprints(first)
	require.NoError(t, first.Close())
	require.Equal(t, keyed, string(recs[0].Fingerprint[:4]) == string(keyedPrefix))
	if !keyed {
		t.Skip("this process makes no keyed fingerprints (no AES instructions, or fips140=only): the record is plain")
	}

	cmd := childtest.Command("TestKeyedRecordMetUnderFIPS140Only", envPlatformFIPSDir+"="+dir, envPlatformFIPSURL+"="+srv.URL, "GODEBUG=fips140=only")
	cmd.Args = append(cmd.Args, "-test.v")
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err, "the fips140=only process failed its checks")
	require.Contains(t, string(out), "--- PASS: TestKeyedRecordMetUnderFIPS140Only")
	assert.Len(t, srv.seen(), 1, "the fips140=only process sent the payment")
}

// forgeGHASH returns p with two 16-byte blocks changed so that a chunk's
// GMAC tag under aesKey stays the same: the field element 1 added to one
// block and H = AES_K(0^128) to the next cancel in GHASH(A) = sum A_i
// H^(m-i+2) + L H (the plaintext's change is the ciphertext's, CTR being
// a XOR).
func forgeGHASH(t *testing.T, p string, aesKey []byte, at int) string {
	t.Helper()
	block, err := aes.NewCipher(aesKey)
	require.NoError(t, err)
	var h [16]byte
	block.Encrypt(h[:], h[:])
	forged := []byte(p)
	forged[at] ^= 0x80 // 1 in GCM's bit order: x^0 is the first byte's top bit
	for i := range h {
		forged[at+16+i] ^= h[i]
	}
	return string(forged)
}

// A large named payment is left pending (charged, answer lost). Whoever
// reads the journal's record (Unfinished here, as a Resumer's Rebuild or a
// reader of the file or table would) and takes its first 16 bytes for the
// MAC key, as a key kept in the record would have been, changes 17 bytes
// of the payment file: sent under the action, it is refused
// (ErrFingerprintMismatch) and not sent. The same forgery under the key
// the journal's secret gives passes (it is sent under the first key, and
// the server, which checks payloads as Stripe does, refuses it with 422):
// the forgery is a real one, and the secret is what keeps it out.
func TestKeyedForgedPayloadOverHTTP(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	srv.commitThenDrop = map[int]bool{1: true}
	j := journal.NewMemory()
	payload := largePayload("L-F")
	ctx := idemretry.WithAction(context.Background(), "pay:L-F")
	leftPending(t, j, post(t, ctx, srv.URL, payload))
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	fp := recs[0].Fingerprint
	tr := transportOver(t, j, idemretry.WithMaxRetries(0))
	if !idemretry.MakesKeyedFingerprints(tr) {
		require.NotEqual(t, keyedPrefix, fp[:4])
		t.Skip("this process makes no keyed fingerprints (no AES instructions, or fips140=only): the record is plain")
	}
	require.Equal(t, keyedPrefix, fp[:4])
	const at = 3<<16 + 16*7

	fromRecord := forgeGHASH(t, payload, fp[:16], at)
	err = sendErr(tr, post(t, ctx, srv.URL, fromRecord))
	assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "a payload forged from the record was not refused")
	assert.Len(t, srv.seen(), 1, "the forged payload was sent under the first payment's key")

	key := idemretry.FingerprintAESKey(tr)
	withSecret := forgeGHASH(t, payload, key[:], at)
	err = sendErr(tr, post(t, ctx, srv.URL, withSecret))
	assert.NotErrorIs(t, err, idemretry.ErrFingerprintMismatch, "the forgery under the journal's key did not pass: the test forges nothing")
	assert.ErrorIs(t, err, idemretry.ErrKeyReused, "the server's refusal of the forged payload under the first key")
	reqs := srv.seen()
	if assert.Len(t, reqs, 2, "the forgery under the journal's key was sent under the first key") {
		assert.Equal(t, reqs[0].Key, reqs[1].Key, "the forgery under the journal's key was sent under the first key")
		assert.Equal(t, sha256.Sum256([]byte(withSecret)), reqs[1].BodyHash, "the forged payload, as forged")
	}
	assert.Equal(t, 1, srv.chargeCount())
}

// The keyed form's tests must hold where new fingerprints are plain: a
// CPU without AES-GCM instructions (linux/386, linux/arm; and arm64 where
// golang.org/x/sys/cpu reads no features, but for Apple's) and a process
// under GODEBUG=fips140=only. Here the CPU features are turned off with
// GODEBUG, which x/sys/cpu and the standard library both read, and the
// tests are run in a child process.
func TestKeyedTestsHoldWhereNewFingerprintsArePlain(t *testing.T) {
	t.Parallel()
	if os.Getenv("GODEBUG") != "" {
		t.Skip("GODEBUG is set: this process is already one of the environments")
	}
	const run = "^(TestKeyedFingerprintDefinition|TestKeyedFingerprintIsNotForgedFromTheRecord|TestPlainFingerprintWhereNotKeyed|" +
		"TestKeyedFingerprintUnderAnotherSecretIsUncheckable|TestKeyedFallbackMatchesOnlyThePayload|" +
		"TestLargeNamedActionIsOneActionAcrossRestarts|TestResumeOfLargeNamedActionWithAnotherPayloadIsRefused|" +
		"TestLargeNamedDoubleTapIsOnePayment|TestLargeNamedActionSharedJournal|TestLargeBodyForms|" +
		"TestUpgradeLargeNamedActionLeftPendingByThePreviousRelease|TestReconcileWaitsForAKeyedLiveFlightToLand|" +
		"TestKeyedSecretFromAFailingRandReader|TestRedirectHopOfALargeNamedActionKeepsItsKeyAcrossRestart|" +
		"TestLargeNamedResumeAndLiveShareOneFlightHashedIDs|TestLargeNamedActionOtherURLOrMethodIsRefused|" +
		"TestLargeNamedJoinerCarriesOnAfterTheLeaderGaveUp|TestLargeNamedResendGetBodyFailingOnTheCheckIsAnActionError|" +
		"TestLargeNamedTapGetBodyFailingOnTheCheckIsAnActionError|" +
		"TestKeyedFormCostsTheSmallNamedPostNoAllocation|TestKeyedForgedPayloadOverHTTP|TestKeyedRecordMetUnderFIPS140Only)$"
	for _, godebug := range []string{"cpu.aes=off,cpu.pclmulqdq=off,cpu.pmull=off", "fips140=only"} {
		t.Run(godebug, func(t *testing.T) {
			// Not childtest.Command: this process runs the keyed tests
			// themselves, as parents, under another GODEBUG, and a child
			// of childtest would take their children's branches.
			cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "GODEBUG="+godebug)
			out, err := cmd.CombinedOutput()
			var failed []string
			passed := 0
			for _, l := range strings.Split(string(out), "\n") {
				l = strings.TrimSpace(l)
				if strings.HasPrefix(l, "--- FAIL") || strings.Contains(l, "Messages:") || strings.Contains(l, "Error Trace:") || strings.HasPrefix(l, "panic:") {
					failed = append(failed, l)
				}
				if strings.HasPrefix(l, "--- PASS") || strings.HasPrefix(l, "--- SKIP") {
					passed++
				}
			}
			require.NoError(t, err, "with GODEBUG=%s the keyed form's tests failed:\n%s", godebug, strings.Join(failed, "\n"))
			assert.GreaterOrEqual(t, passed, 18, "the child ran too few of the keyed tests:\n%s", out)
		})
	}
}
