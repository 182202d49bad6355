package filejournal

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// A caller's own key K names its action "key:K" and is reserved with
// ReuseAny, so once the done record of an earlier use of K has expired, a
// new use of K creates a new record with the same id and the same key. On
// replay that new record must not be taken for an update of the old done
// one (done is final: the new pending record would come back as the old
// done one, and then expire again and vanish). These tests drop the old
// record from memory the two ways that wrote no delete to the file:
// expired at open, and a compaction that failed before its rename. (Issue
// 7 follow-up, found in review.)

// sameKeyKeys are the two storage forms of a key: a string, and a
// canonical UUID stored as 16 bytes.
var sameKeyKeys = []string{"K", "0f8e2b9a-53c1-4d7e-9a10-2b3c4d5e6f70"}

func doneWithKey(key string, at time.Time) journal.Record {
	d := doneAt("key:"+key, at)
	d.Key, d.Status = key, 200
	return d
}

func pendingWithKey(key string, at time.Time) journal.Record {
	p := entry("key:" + key)
	p.Key, p.CreatedAt = key, time.UnixMilli(at.UnixMilli())
	p.Fingerprint[0] ^= 0xff // another payload than the old one's
	return p
}

// requirePendingAfterReopen reopens dir and checks that the record of
// "key:"+key is the pending one p.
func requirePendingAfterReopen(t *testing.T, dir string, o config, p journal.Record) {
	t.Helper()
	s, _ := mustOpen(t, dir, o)
	defer s.Close()
	e, ok, err := s.get(p.ActionID)
	require.NoError(t, err)
	require.True(t, ok, "acknowledged pending record lost after reopen")
	require.Equal(t, journal.StatePending, e.State, "pending record came back as the old done one")
	require.Equal(t, p.Fingerprint, e.Fingerprint)
	require.Equal(t, p.CreatedAt, e.CreatedAt)
}

// reservePendingSurvivesReopen reserves a new pending record under key in
// s, which must create it, closes s, and checks that the record is that
// pending one after a reopen of dir (with o, without its hooks).
func reservePendingSurvivesReopen(t *testing.T, s *Journal, dir string, o config, key string, at time.Time) {
	t.Helper()
	p := pendingWithKey(key, at)
	got, created, err := s.Reserve(context.Background(), p, journal.ReuseAny)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, journal.StatePending, got.State)
	require.NoError(t, s.Close())
	o.hooks = nil
	requirePendingAfterReopen(t, dir, o, p)
}

func TestExpiredAtOpenThenSameKeyReserveSurvivesReopen(t *testing.T) {
	for _, key := range sameKeyKeys {
		t.Run(key, func(t *testing.T) {
			o, clk, t0 := hourClock()
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, o)
			reserve(t, s, doneWithKey(key, t0))
			clk.Set(t0.Add(61 * time.Minute)) // the retention seen to pass while open
			require.NoError(t, s.Close())

			clk.Set(t0.Add(2 * time.Hour))
			s, rep := mustOpen(t, dir, o)
			require.Equal(t, 0, rep.Records) // expired, dropped at open
			require.False(t, rep.Compacted)  // a small file: no compaction
			reservePendingSurvivesReopen(t, s, dir, o, key, clk.Now())
		})
	}
}

func TestFailedCompactionThenSameKeyReserveSurvivesReopen(t *testing.T) {
	for _, key := range sameKeyKeys {
		t.Run(key, func(t *testing.T) {
			o, clk, t0, fail := faultyHourClock()
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, o)
			reserve(t, s, doneWithKey(key, t0))

			clk.Set(t0.Add(2 * time.Hour)) // expired
			failCompaction(t, s, fail)     // fails before the rename

			reservePendingSurvivesReopen(t, s, dir, o, key, clk.Now())
		})
	}
}

// The same with a sync failure of journal.tmp, the reviewer's form.
func TestFailedCompactionSyncThenSameKeyReserveSurvivesReopen(t *testing.T) {
	o, clk, t0 := hourClock()
	var failTmp sync.Map
	o.hooks = &hooks{wrapFile: func(name string, f file) file {
		if name == tmpName {
			return &faultyFile{file: f, fail: &failTmp, name: name}
		}
		return f
	}}
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	reserve(t, s, doneWithKey("K", t0))
	clk.Set(t0.Add(2 * time.Hour))
	failTmp.Store("sync", errNoSpace)
	require.ErrorIs(t, s.Compact(context.Background()), errNoSpace)
	failTmp.Delete("sync")
	reservePendingSurvivesReopen(t, s, dir, o, "K", clk.Now())
}

// A record dropped from memory as expired is gone for good, as one that
// Reserve drops or a compaction removes is: a Forget of it returns once
// that removal is synced, and a crash right after it, then a wall clock set
// back further than the clock lead (so that expiry by the clock no longer
// holds), cannot bring it back. Dropped at open, and by a compaction that
// failed before its rename.
func TestExpiredDropIsDurable(t *testing.T) {
	for _, how := range []string{"open", "failed-compaction"} {
		t.Run(how, func(t *testing.T) {
			o, clk, t0, fail := faultyHourClock()
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, o)
			d := reserve(t, s, doneWithKey("K", t0))
			clk.Set(t0.Add(61 * time.Minute))
			if how == "open" {
				require.NoError(t, s.Close())
				clk.Set(t0.Add(2 * time.Hour))
				var rep Recovery
				s, rep = mustOpen(t, dir, o)
				require.Equal(t, 0, rep.Records)
			} else {
				failCompaction(t, s, fail)
			}
			_, ok, err := s.get(d.ActionID)
			require.NoError(t, err)
			require.False(t, ok)
			require.NoError(t, s.Forget(context.Background(), d.ActionID))

			// Crash now: the disk image is the file as it stands.
			data, err := os.ReadFile(filepath.Join(dir, journalName))
			require.NoError(t, err)
			crash := writeJournal(t, data)
			require.NoError(t, s.Close())
			clk.Set(t0.Add(-25 * time.Hour)) // past the lead (24 h) behind the mark
			o.hooks = nil
			s2, _ := mustOpen(t, crash, o)
			defer s2.Close()
			_, ok, err = s2.get(d.ActionID)
			require.NoError(t, err)
			require.False(t, ok, "a forgotten, expired record came back")
		})
	}
}

// Salvage skips a damaged frame: if that frame held the Forget of a done
// record, the record created after it under the same key must still not be
// read as an update of the done one. The creation's own delete, in the
// creation's frame, makes replay independent of the lost Forget.
func TestSalvagedForgetThenSameKeyRecordKept(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	ctx := context.Background()
	reserve(t, s, doneWithKey("K", time.Now()))
	require.NoError(t, s.Forget(ctx, "key:K"))
	p := pendingWithKey("K", time.Now())
	reserve(t, s, p)
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	offs := frameOffsets(t, data)
	require.Len(t, offs, 4) // the new journal's end, done, Forget, pending

	o := testOpts()
	o.salvage = true
	s, rep := mustOpen(t, writeJournal(t, flipBit(data, offs[2]+frameHeaderSize, 0)), o)
	defer s.Close()
	require.Len(t, rep.Salvaged, 1)
	e, ok, err := s.get(p.ActionID)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, journal.StatePending, e.State, "the new record was read as an update of the forgotten one")
	require.Equal(t, p.Fingerprint, e.Fingerprint)
}
