package filejournal

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// TestLiveBytesMatchReplay: the live-bytes estimate that compaction is
// judged by, kept by Reserve, Update (which changes a record in place) and
// Forget, equals the one a reopen computes by replaying the file, record
// by record; and the records read back are the ones written. Updates cross
// the varint boundaries of attempts and status, so the encoded size of a
// record changes with them, and keys are both UUIDs and custom strings.
func TestLiveBytesMatchReplay(t *testing.T) {
	dir := t.TempDir()
	j, _ := mustOpen(t, dir, testOpts())
	ctx := context.Background()
	var want []journal.Record
	for i := range 40 {
		e := benchEntry(i)
		if i%3 == 0 {
			e.Key = fmt.Sprintf("custom-key-%d", i) // not a UUID: kept as a string
		}
		got, created, err := j.Reserve(ctx, e, journal.ReuseAny)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, e.Key, got.Key)
		for _, a := range []int{1, 127, 128, 300, 20000} {
			e.Attempts = a
			e.Status = a % 600
			require.NoError(t, j.Update(ctx, e))
		}
		if i%4 == 0 {
			e.State, e.Status = journal.StateDone, 201
			require.NoError(t, j.Update(ctx, e))
		}
		if i%5 == 0 {
			require.NoError(t, j.Forget(ctx, e.ActionID))
			continue
		}
		want = append(want, e)
	}
	before := j.stats()
	require.NoError(t, j.Close())

	j, _ = mustOpen(t, dir, testOpts())
	defer j.Close()
	after := j.stats()
	require.Equal(t, before.Records, after.Records)
	require.Equal(t, before.LiveBytes, after.LiveBytes, "live bytes kept while open differ from those replay computes")
	for _, e := range want {
		got, created, err := j.Reserve(ctx, e, journal.ReuseAny)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, e.Key, got.Key)
		require.Equal(t, e.State, got.State)
		require.Equal(t, e.Attempts, got.Attempts)
		require.Equal(t, e.Status, got.Status)
	}
}
