package filejournal

import (
	"context"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// craftJournal writes a journal file whose frames hold ops, one frame per
// element, after an empty snapshot; the frames are what a writer (two
// writers' interleaved updates, say) could have left.
func craftJournal(t *testing.T, frames ...[]op) string {
	t.Helper()
	return craftJournalFlags(t, flagSeen, frames...)
}

// craftJournalFlags is craftJournal with the given header flags.
func craftJournalFlags(t *testing.T, flags uint16, frames ...[]op) string {
	t.Helper()
	const gen = 0x5eed
	b := header{minor: versionMinor, flags: flags, gen: gen, baseSeq: 1}.append(nil)
	seq := uint64(1)
	b = appendFrame(b, gen, seq, appendPayload(nil, []op{{kind: opEnd}}))
	for _, f := range frames {
		seq++
		b = appendFrame(b, gen, seq, appendPayload(nil, f))
	}
	return writeJournal(t, b)
}

func upsert(t *testing.T, e journal.Record) op {
	t.Helper()
	require.NoError(t, journal.CheckRecord(e))
	return op{kind: opUpsert, r: toRec(e.ActionID, e)}
}

// Done is final in the Journal: an update after done changes Attempts only.
func TestUpdateDoneIsFinal(t *testing.T) {
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	defer s.Close()
	e := reserve(t, s, entry("a"))
	require.NoError(t, update(s, "a", e.Key, journal.StateDone, 1, 201))
	require.NoError(t, update(s, "a", e.Key, journal.StatePending, 3, 0))
	require.NoError(t, update(s, "a", e.Key, journal.StateDone, 4, 500))
	got, ok, err := s.get("a")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, journal.StateDone, got.State)
	assert.Equal(t, 201, got.Status)
	assert.Equal(t, 4, got.Attempts)
}

// Replay applies the same rule: a stale frame written after a done frame
// (by a version without the rule, or a second writer's late update) cannot
// undo the outcome on restart. A record under another key (a replacement),
// or created again after a Forget, is a new action and replaces it.
func TestReplayDoneIsFinal(t *testing.T) {
	a := entry("a")
	done := a
	done.State, done.Attempts, done.Status = journal.StateDone, 1, 201
	stale := a
	stale.State, stale.Attempts = journal.StatePending, 2
	staleUnknown := a
	staleUnknown.State, staleUnknown.Attempts = journal.StateUnknown, 1
	staleDone := a
	staleDone.State, staleDone.Attempts, staleDone.Status = journal.StateDone, 1, 500

	b := entry("b") // replaced under another key after done
	bDone := b
	bDone.State, bDone.Status = journal.StateDone, 200
	b2 := entry("b")

	c := entry("c") // forgotten after done, created again with the same key
	cDone := c
	cDone.State, cDone.Status = journal.StateDone, 200

	dir := craftJournal(t,
		[]op{upsert(t, a)},
		[]op{upsert(t, done)},
		[]op{upsert(t, stale), upsert(t, staleUnknown)},
		[]op{upsert(t, staleDone)},
		[]op{upsert(t, b), upsert(t, bDone)},
		[]op{upsert(t, b2)},
		[]op{upsert(t, c), upsert(t, cDone)},
		[]op{{kind: opDelete, r: rec{id: "c"}}, upsert(t, c)},
	)
	s, _ := mustOpen(t, dir, testOpts())
	defer s.Close()
	got, ok, err := s.get("a")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, journal.StateDone, got.State, "a stale frame undid done at replay")
	assert.Equal(t, 201, got.Status)
	assert.Equal(t, 2, got.Attempts)
	got, _, _ = s.get("b")
	assert.Equal(t, b2.Key, got.Key)
	assert.Equal(t, journal.StatePending, got.State)
	got, _, _ = s.get("c")
	assert.Equal(t, c.Key, got.Key)
	assert.Equal(t, journal.StatePending, got.State, "a record created again after Forget is a new action")
	un, err := s.Unfinished(context.Background())
	require.NoError(t, err)
	for _, u := range un {
		assert.NotEqual(t, "a", u.ActionID)
	}
}

// A replacement under ReusePending that reuses the done record's key (a
// caller's own key) is written as a delete and a creation, so that replay
// cannot mistake it for a stale update.
func TestReplacementSurvivesReplay(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	e := entry("a")
	e.Key = "caller-key-1"
	reserve(t, s, e)
	require.NoError(t, update(s, "a", e.Key, journal.StateDone, 1, 201))
	got, created, err := s.Reserve(context.Background(), e, journal.ReusePending)
	require.NoError(t, err)
	require.True(t, created)
	assert.Equal(t, journal.StatePending, got.State)
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	got, _, _ = s.get("a")
	assert.Equal(t, journal.StatePending, got.State, "the replacement came back as the old done record")
}
