package idemretry_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hK2's review: a large payment (its fingerprint keyed under the journal
// directory's fingerprint.key) left maybe-processed; the app restarts and
// fingerprint.key is gone (restored from a backup without it, deleted by a
// cleaner). The resend is refused, nothing sent, until its key window ends.
// Its kind must not tell the app what KindMaybeProcessed tells it, "send
// it again with the same ActionID to get its answer": every resend is
// refused the same way. The journal lost what it needs to check the
// action: KindJournal ("the journal is damaged"), MaybeProcessed true.
func TestReviewHK2UncheckableLargePaymentKind(t *testing.T) {
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
		assert.True(t, f.MaybeProcessed)
		assert.Equal(t, key, f.Key)
		assert.Equal(t, idemretry.KindJournal, f.Kind, "told to resend what is refused at every resend")
	}
	_, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
	reqs, _ := srv.snapshot()
	assert.Len(t, reqs, 1, "sent again")
}
