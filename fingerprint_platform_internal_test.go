package idemretry

// The keyed fingerprint (fingerprint.go) across platforms: a record made
// on a machine with AES instructions, checked on one without them and on
// one where AES-GCM is refused (GODEBUG=fips140=only); and the 2^-32
// fallback of a plain fingerprint that begins with keyedMagic. Ported from
// the review of hF2.

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// platformPayload is a named upload of four full chunks and a partial
// one, bytes that look like a payment file.
func platformPayload() []byte {
	const n = 4*keyedChunk + 1234
	line := []byte(`{"line":"L-hF2","amount":1000,"iban":"DE89370400440532013000"}` + "\n")
	return bytes.Repeat(line, n/len(line)+1)[:n]
}

// A fingerprint that is neither form's of the payload never matches: the
// 2^-32 fallback (a plain fingerprint beginning with keyedMagic is also
// checked as plain) lets the request's plain SHA-256 match only itself.
// Here the record looks keyed (the magic, then the plain fingerprint's
// bytes, whose "key id" is none the Transport has): it is no plain
// fingerprint of the payload, so it is uncheckable, never a match; and
// a plain record does not match a changed body.
func TestKeyedFallbackMatchesOnlyThePayload(t *testing.T) {
	t.Parallel()
	key, _ := testKey(t)
	p := platformPayload()
	req, b := keyedRequest(t, p, false, 0)
	plain, err := fingerprint(req, b)
	require.NoError(t, err)
	want := plain
	copy(want[:4], keyedMagic[:])
	for name, k := range map[string]*fpKey{"the journal's key": &key, "no key": {}} {
		_, same, err := matchFingerprint(req, b, want, k)
		require.ErrorIs(t, err, ErrFingerprintUncheckable, name)
		assert.False(t, same, "%s: a fingerprint neither form gives matched", name)
	}
	// The same with the Transport's own key id: checked in the keyed
	// form, a mismatch (not uncheckable), and the plain form no match.
	if key.ok {
		copy(want[4:8], key.id[:])
		_, same, err := matchFingerprint(req, b, want, &key)
		require.NoError(t, err)
		assert.False(t, same, "a keyed-looking fingerprint with the Transport's key id matched")
	}
	q := bytes.Clone(p)
	q[len(q)-1] ^= 1
	r2, b2 := keyedRequest(t, q, false, 0)
	_, same, err := matchFingerprint(r2, b2, plain, &key)
	require.NoError(t, err)
	assert.False(t, same)
}

// Environment of the child processes of the platform tests below.
const (
	envPlatformFP = "IDEMRETRY_PLATFORM_KEYED_FP" // hex of the parent's keyed fingerprint
)

// platformChild re-runs this test binary's test named run with godebug
// set, for the fingerprint fp made here, and returns its output.
func platformChild(t *testing.T, run, godebug string, fp journal.Fingerprint) string {
	t.Helper()
	cmd := childtest.Command(run, envPlatformFP+"="+hex.EncodeToString(fp[:]), "GODEBUG="+godebug)
	cmd.Args = append(cmd.Args, "-test.v")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child (GODEBUG=%s) failed:\n%s", godebug, out)
	require.Contains(t, string(out), "--- PASS: "+run, "the child did not run the check:\n%s", out)
	return string(out)
}

func platformChildFP(t *testing.T) journal.Fingerprint {
	t.Helper()
	raw, err := hex.DecodeString(os.Getenv(envPlatformFP))
	require.NoError(t, err)
	return journal.Fingerprint(raw)
}

// A fleet shares one journal (and so its secret) between machines with and
// without AES-GCM instructions (amd64 and 32-bit arm, say). A record made
// where the keyed form is used must be checked where it is not: the CPU
// features turned off with GODEBUG (x/sys/cpu and the standard library
// both read it), the child draws plain fingerprints and checks the
// parent's keyed one with the pure-Go AES and GHASH under the same
// secret: the payload matches, a byte changed does not.
func TestKeyedRecordCheckedWithoutAESInstructions(t *testing.T) {
	key, secret := testKey(t)
	p := platformPayload()
	if childtest.IsChild() {
		require.False(t, keyedHardware, "GODEBUG=%s left keyedHardware on", os.Getenv("GODEBUG"))
		require.True(t, key.ok, "AES-GCM in software gives a key")
		fp := platformChildFP(t)
		req, b := keyedRequest(t, p, true, 3)
		got, same, err := matchFingerprint(req, b, fp, &key)
		require.NoError(t, err)
		require.True(t, same, "the parent's keyed record did not match its payload without AES instructions")
		require.Equal(t, fp, got)
		q := bytes.Clone(p)
		q[keyedChunk] ^= 1
		r2, b2 := keyedRequest(t, q, false, 0)
		_, same, err = matchFingerprint(r2, b2, fp, &key)
		require.NoError(t, err)
		require.False(t, same, "a changed payload matched")
		mine, err := newFingerprint(req, b, true, &key)
		require.NoError(t, err)
		plain, err := fingerprint(req, b)
		require.NoError(t, err)
		require.Equal(t, plain, mine, "without AES instructions a new fingerprint is plain")
		return
	}
	needKeyed(t, &key)
	req, b := keyedRequest(t, p, false, 0)
	fp := newKeyed(t, req, b, &key)
	require.Equal(t, keyedReference(t, secret, fp, req.Method, req.URL.String(), p), fp)
	platformChild(t, "TestKeyedRecordCheckedWithoutAESInstructions",
		"cpu.aes=off,cpu.pclmulqdq=off,cpu.pmull=off", fp)

	// And in this process with keyedHardware forced off: a new fingerprint
	// is plain, the keyed record is still checked.
	was := keyedHardware
	keyedHardware = false
	defer func() { keyedHardware = was }()
	mine, err := newFingerprint(req, b, true, &key)
	require.NoError(t, err)
	assert.False(t, isKeyed(mine))
	_, same, err := matchFingerprint(req, b, fp, &key)
	require.NoError(t, err)
	assert.True(t, same)
}

// Under GODEBUG=fips140=only cipher.NewGCM refuses (a caller-chosen
// nonce). Nothing panics there: the journal's secret gives no key, a new
// fingerprint is plain, which is checked as ever, and a keyed record (made
// by a machine not in that mode, under the same secret) cannot be checked:
// ErrFingerprintUncheckable, for the payload and for another alike, never
// a match nor a mismatch; samePayload's error is prefixed once.
func TestKeyedRecordUnderFIPS140Only(t *testing.T) {
	t.Parallel()
	key, _ := testKey(t)
	p := platformPayload()
	if childtest.IsChild() {
		require.False(t, key.ok, "fips140=only: the journal's secret gave a key")
		fp := platformChildFP(t)
		req, b := keyedRequest(t, p, true, 5)
		mine, err := newFingerprint(req, b, true, &key)
		require.NoError(t, err)
		require.False(t, isKeyed(mine), "fips140=only: a new fingerprint is plain")
		_, same, err := matchFingerprint(req, b, mine, &key)
		require.NoError(t, err)
		require.True(t, same)
		tr := &Transport{fpKey: key}
		for _, body := range [][]byte{p, append(bytes.Clone(p), 'x')} {
			r, bd := keyedRequest(t, body, false, 0)
			_, same, err := matchFingerprint(r, bd, fp, &key)
			require.ErrorIs(t, err, ErrFingerprintUncheckable)
			require.False(t, same)
			who := identity{fp: mine}
			_, _, err = tr.samePayload(payload{req: r, body: bd}, &who, fp)
			require.ErrorIs(t, err, ErrFingerprintUncheckable)
			fmt.Printf("samePayload: %v\n", err)
		}
		return
	}
	needKeyed(t, &key)
	req, b := keyedRequest(t, p, false, 0)
	fp := newKeyed(t, req, b, &key)
	out := platformChild(t, "TestKeyedRecordUnderFIPS140Only", "fips140=only", fp)
	t.Log(strings.TrimSpace(out))
}
