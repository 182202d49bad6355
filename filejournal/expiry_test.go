package filejournal

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// T13: done records past the retention are dropped by compaction and ignored
// by lookups; pending and unknown ones never expire; a clock set back
// neither revives nor loses anything, across restarts too.
func TestExpiryFakeClock(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	mk := func(id string, state journal.State) journal.Record {
		e := entry(id)
		e.CreatedAt = time.UnixMilli(t0.UnixMilli())
		got := reserve(t, s, e)
		if state != journal.StatePending {
			require.NoError(t, update(s, id, got.Key, state, 1, 200))
		}
		return got
	}
	done := mk("done", journal.StateDone)
	mk("done2", journal.StateDone)
	pending, unknown := mk("pending", journal.StatePending), mk("unknown", journal.StateUnknown)

	clk.Set(t0.Add(59 * time.Minute)) // within the retention
	got, created, err := s.Reserve(context.Background(), entry("done"), journal.ReuseAny)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, done.Key, got.Key)

	clk.Set(t0.Add(61 * time.Minute)) // past it
	_, ok, _ := s.get("done2")
	assert.False(t, ok, "expired done record visible")
	clk.Set(t0) // the clock jumps back: done2 stays expired
	_, ok, _ = s.get("done2")
	assert.False(t, ok, "clock set back revived an expired record")
	got, created, err = s.Reserve(context.Background(), entry("done"), journal.ReuseAny)
	require.NoError(t, err)
	assert.True(t, created, "expired done record reused")
	assert.NotEqual(t, done.Key, got.Key)

	clk.Set(t0.Add(1000 * time.Hour))
	require.NoError(t, s.Compact(context.Background()))
	require.NoError(t, s.Close())

	clk.Set(t0) // restart with the clock set back
	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	// Only pending and unknown records survive (the new "done" is pending).
	assert.Equal(t, 3, rep.Records)
	for _, e := range []journal.Record{pending, unknown} {
		got, ok, _ := s.get(e.ActionID)
		require.True(t, ok, e.ActionID)
		assert.Equal(t, e.Key, got.Key)
	}
	_, ok, _ = s.get("done2")
	assert.False(t, ok)
	un, err := s.Unfinished(context.Background())
	require.NoError(t, err)
	assert.Len(t, un, 3)
}

// A clock set back before a restart, with no compaction in between, must
// not revive a record that had expired: the high-water mark is persisted.
func TestClockHighWaterPersists(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s := openHolding(t, dir, o, doneAt("d", t0))
	clk.Set(t0.Add(2 * time.Hour))
	other := entry("other")
	other.CreatedAt = time.UnixMilli(clk.Now().UnixMilli())
	reserve(t, s, other) // a batch carries the clock
	require.NoError(t, s.Close())
	clk.Set(t0)
	s, _ = mustOpen(t, dir, o)
	_, ok, _ := s.get("d")
	assert.False(t, ok)
	require.NoError(t, s.Close())

	// A mark further ahead than MaxClockLead was set by a clock that ran
	// ahead and was corrected: it is not believed, so a done record created
	// after the correction is not expired early.
	o.maxClockLead = time.Hour
	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	fresh := doneAt("fresh", t0)
	reserve(t, s, fresh)
	got, ok, _ := s.get("fresh")
	require.True(t, ok, "a done record made after the correction is kept")
	assert.Equal(t, fresh.Key, got.Key)
}

// Now never runs backwards: records written at T+25h, then the clock set
// back 2h, and the same across a reopen.
func TestNowNeverRunsBack(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	o := testOpts()
	o.now = clk.Now
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	assert.True(t, s.Now().Equal(t0))
	late := t0.Add(25 * time.Hour)
	clk.Set(late)
	e := entry("a")
	e.CreatedAt = time.UnixMilli(late.UnixMilli())
	reserve(t, s, e)
	clk.Set(late.Add(-2 * time.Hour))
	assert.False(t, s.Now().Before(late), "clock set back: %v", s.Now())
	require.NoError(t, s.Close())

	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	assert.False(t, s.Now().Before(late), "after reopen: %v", s.Now())
	// A clock ahead again is returned as is, to the nanosecond.
	ahead := late.Add(time.Hour + time.Nanosecond)
	clk.Set(ahead)
	assert.True(t, s.Now().Equal(ahead))
}

// A compaction that fails before its rename must not make the Journal think
// the clock's high-water mark is on disk: the next batch has to carry it,
// or a clock set back before a restart revives an expired record.
func TestFailedCompactionKeepsClockMark(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	var fail sync.Map
	o.hooks = faultyHooks(&fail)
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	d := doneAt("d", t0)
	reserve(t, s, d)
	p := entry("p")
	p.CreatedAt = time.UnixMilli(t0.UnixMilli())
	p = reserve(t, s, p)

	clk.Set(t0.Add(2 * time.Hour)) // d has expired
	failCompaction(t, s, &fail)
	require.NoError(t, update(s, "p", p.Key, journal.StateUnknown, 1, 0))
	require.NoError(t, s.Sync(context.Background())) // a batch after the failure
	require.NoError(t, s.Close())

	clk.Set(t0) // restart with the clock set back
	o.hooks = nil
	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	assert.False(t, s.Now().Before(t0.Add(2*time.Hour)), "clock mark lost: %v", s.Now())
	_, ok, _ := s.get("d")
	assert.False(t, ok, "expired record revived")
	got, ok, _ := s.get("p")
	require.True(t, ok)
	assert.Equal(t, journal.StateUnknown, got.State)
}

// A wall clock that jumps while the journal is closed (a clock that was
// behind, then corrected) expires nothing: time the journal has not seen
// pass is never counted. Time it sees pass while open is.
func TestExpiryIgnoresClockJumpWhileClosed(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	d := doneAt("d", t0)
	d = reserve(t, s, d)
	require.NoError(t, s.Close())

	clk.Set(t0.Add(1000 * time.Hour)) // corrected while closed
	s, rep := mustOpen(t, dir, o)
	assert.Equal(t, 1, rep.Records, "the record was dropped at open")
	got, created, err := s.Reserve(context.Background(), entry("d"), journal.ReuseAny)
	require.NoError(t, err)
	assert.False(t, created, "a new key was minted for a record the journal saw made moments ago")
	assert.Equal(t, d.Key, got.Key)
	require.NoError(t, s.Compact(context.Background()))
	_, ok, _ := s.get("d")
	assert.True(t, ok, "compaction dropped it")

	clk.Set(t0.Add(1000*time.Hour + 61*time.Minute)) // an hour passes, seen
	_, ok, _ = s.get("d")
	assert.False(t, ok, "kept past its retention, with the time seen to pass")
	require.NoError(t, s.Close())
}

// The observed time survives a restart: time seen in one run counts in the
// next, so records still expire in an application that restarts often.
func TestObservedTimePersists(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s := openHolding(t, dir, o, doneAt("d", t0))
	clk.Set(t0.Add(40 * time.Minute))
	require.NoError(t, s.Close()) // writes the observed time

	clk.Set(t0.Add(-5 * time.Hour)) // whatever the clock says at the restart
	s, _ = mustOpen(t, dir, o)
	clk.Set(t0.Add(-5*time.Hour + 15*time.Minute))
	_, ok, _ := s.get("d")
	assert.True(t, ok, "55 minutes seen")
	require.NoError(t, s.Close())

	clk.Set(t0.Add(2 * time.Hour))
	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	clk.Set(t0.Add(2*time.Hour + 6*time.Minute))
	_, ok, _ = s.get("d")
	assert.False(t, ok, "61 minutes seen over three runs")
}

// A file written before observed times (without flagSeen) is of an
// earlier version of the format, which this one does not read: Open
// refuses it with journal.ErrIncompatible and changes nothing. (Until the
// module had a first release, such files were opened and rewritten.)
func TestOpenFileWithoutObservedTimesRefused(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d := doneAt("d", t0)
	dir := craftJournalFlags(t, 0, []op{upsert(t, d)}, []op{{kind: opClock, clock: t0.UnixMilli()}})
	before, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	_, _, err = openWith(dir, testOpts())
	require.ErrorIs(t, err, journal.ErrIncompatible)
	assert.Contains(t, err.Error(), "observed times")
	after, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	assert.Equal(t, before, after, "the file was changed")
}

// An upsert without its observed time is not of this format either: in a
// frame whose CRC holds, it is damage, never read as a record that ages
// from the open.
func TestUpsertWithoutObservedTimeIsMalformed(t *testing.T) {
	t.Parallel()
	o := upsert(t, entry("d")) // observed time 0: its last byte
	b := appendOp(nil, &o)
	require.Equal(t, byte(upsertSeen), b[1]&upsertSeen)
	b[1] &^= upsertSeen
	b = b[:len(b)-1]
	payload := append(binary.AppendUvarint(nil, 1), b...)
	assert.ErrorIs(t, decodePayload(payload, func(*op) error { return nil }), errPayload)

	dir := craftJournal(t, []op{o})
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	// Rewrite the upsert's frame with the old-style payload, then add a
	// later frame so that it is not a torn tail.
	offs := frameOffsets(t, data)
	h, err := parseHeader(data)
	require.NoError(t, err)
	data = appendFrame(data[:offs[1]], h.gen, 2, payload)
	data = appendFrame(data, h.gen, 3, appendPayload(nil, []op{{kind: opClock, clock: 1}}))
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), data, 0o600))
	_, _, err = openWith(dir, testOpts())
	var ce *CorruptionError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, int64(offs[1]), ce.Offset)
}
