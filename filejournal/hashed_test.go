package filejournal

import (
	"context"
	"testing"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With WithHashedIDs, Unfinished returns "sha256:<hex>" ids: the
// actions "to resume or reconcile". Reserve, Update and Forget must map that
// form back to the same record (Journal.storedID), as sqljournal does:
// otherwise Reserve would hash the digest form again and mint a second
// record with a new key for an action whose outcome is unknown, and Update
// of the listed record would fail with journal.ErrNotFound. (Found in review.)
func TestHashedUnfinishedIDResumesSameRecord(t *testing.T) {
	ctx := context.Background()
	j := openJ(t, t.TempDir(), WithHashedIDs())
	r, created, err := j.Reserve(ctx, jrec("pay:order-17"), journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	require.Len(t, un, 1)

	upd := un[0]
	upd.State, upd.Status = journal.StateDone, 200
	assert.NoError(t, j.Update(ctx, upd), "Update of the record Unfinished returned")

	again := jrec(un[0].ActionID)
	again.State = journal.StatePending
	got, created, err := j.Reserve(ctx, again, journal.ReuseAny)
	require.NoError(t, err)
	require.False(t, created, "resuming the listed action minted a new key %s (old %s)", got.Key, r.Key)
}
