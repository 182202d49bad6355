package filejournal

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wall clock that jumps while the journal is closed (a clock that was
// behind, then corrected) expires nothing: time the journal has not seen
// pass is never counted. Time it sees pass while open is.
func TestExpiryIgnoresClockJumpWhileClosed(t *testing.T) {
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
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	d := doneAt("d", t0)
	reserve(t, s, d)
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
