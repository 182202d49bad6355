package journal

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// craftJournal writes a journal file whose frames hold ops, one frame per
// element, after an empty snapshot; the frames are what a writer (an older
// version, or two writers' interleaved updates) could have left.
func craftJournal(t *testing.T, frames ...[]op) string {
	t.Helper()
	const gen = 0x5eed
	b := header{minor: versionMinor, gen: gen, baseSeq: 1}.append(nil)
	seq := uint64(1)
	b = appendFrame(b, gen, seq, appendPayload(nil, []op{{kind: opEnd}}))
	for _, f := range frames {
		seq++
		b = appendFrame(b, gen, seq, appendPayload(nil, f))
	}
	return writeJournal(t, b)
}

func upsert(t *testing.T, e Entry) op {
	t.Helper()
	r, err := toRec(e)
	require.NoError(t, err)
	return op{kind: opUpsert, r: r}
}

// Done is final in the Store: an update after done changes Attempts only.
func TestUpdateDoneIsFinal(t *testing.T) {
	s, _ := mustOpen(t, t.TempDir(), testOpts())
	defer s.Close()
	e := reserve(t, s, entry("a"))
	require.NoError(t, s.Update("a", e.Key, StateDone, 1, 201))
	require.NoError(t, s.Update("a", e.Key, StatePending, 3, 0))
	require.NoError(t, s.Update("a", e.Key, StateDone, 4, 500))
	got, ok, err := s.Get("a")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, StateDone, got.State)
	assert.Equal(t, uint16(201), got.Status)
	assert.Equal(t, uint32(4), got.Attempts)
}

// Replay applies the same rule: a stale frame written after a done frame
// (by a version without the rule, or a second writer's late update) cannot
// undo the outcome on restart. A record under another key (a replacement),
// or created again after a Forget, is a new action and replaces it.
func TestReplayDoneIsFinal(t *testing.T) {
	a := entry("a")
	done := a
	done.State, done.Attempts, done.Status = StateDone, 1, 201
	stale := a
	stale.State, stale.Attempts = StatePending, 2
	staleUnknown := a
	staleUnknown.State, staleUnknown.Attempts = StateUnknown, 1
	staleDone := a
	staleDone.State, staleDone.Attempts, staleDone.Status = StateDone, 1, 500

	b := entry("b") // replaced under another key after done
	bDone := b
	bDone.State, bDone.Status = StateDone, 200
	b2 := entry("b")

	c := entry("c") // forgotten after done, created again with the same key
	cDone := c
	cDone.State, cDone.Status = StateDone, 200

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
	got, ok, err := s.Get("a")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, StateDone, got.State, "a stale frame undid done at replay")
	assert.Equal(t, uint16(201), got.Status)
	assert.Equal(t, uint32(2), got.Attempts)
	got, _, _ = s.Get("b")
	assert.Equal(t, b2.Key, got.Key)
	assert.Equal(t, StatePending, got.State)
	got, _, _ = s.Get("c")
	assert.Equal(t, c.Key, got.Key)
	assert.Equal(t, StatePending, got.State, "a record created again after Forget is a new action")
	un, err := s.Unfinished()
	require.NoError(t, err)
	for _, u := range un {
		assert.NotEqual(t, "a", u.ID)
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
	require.NoError(t, s.Update("a", e.Key, StateDone, 1, 201))
	got, created, err := s.Reserve(context.Background(), e, true)
	require.NoError(t, err)
	require.True(t, created)
	assert.Equal(t, StatePending, got.State)
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	got, _, _ = s.Get("a")
	assert.Equal(t, StatePending, got.State, "the replacement came back as the old done record")
}
