package filejournal

// The form of a record's key (journal.KeyForm), on disk: format 1.1 keeps
// it in two bits of each upsert's flags (upsertForm) under the header flag
// flagKeyForm; a file of format 1.0 is read with every form unrecorded and
// rewritten as 1.1 before anything is appended to it.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/journal"
)

// format10Flags are the header flags a reader of format 1.0 knows (its
// knownFlags): it refuses a file with any other as incompatible.
const format10Flags = flagHashedIDs | flagSeen

// testdata/journal-v1.0 was written by the release of format 1.0 (commit
// 4576616's encoder): three pending actions, pay:order-1 and pay:order-3
// under UUID keys, key:order-2-key under the caller's key order-2-key, the
// third updated to outcome-unknown with 6 attempts.
var format10Records = []journal.Record{
	{ActionID: "pay:order-1", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324", CreatedAt: time.UnixMilli(1767225600000), State: journal.StatePending, Attempts: 1},
	{ActionID: "key:order-2-key", Key: "order-2-key", CreatedAt: time.UnixMilli(1767225601000), State: journal.StatePending, Attempts: 2},
	{ActionID: "pay:order-3", Key: "5f1c2a9b-7d3e-4f60-8a1b-2c3d4e5f6a7b", CreatedAt: time.UnixMilli(1767225602000), State: journal.StateUnknown, Attempts: 6},
}

// A journal of format 1.0 opens: its records are read with their keys'
// forms unrecorded (the Transport sends those in the form its
// WithQuotedKey says, as that release did), and the file is rewritten as
// format 1.1 (flagKeyForm) before anything is appended, so that a release
// of format 1.0 refuses it from then on (journal.ErrIncompatible) instead
// of reading the forms as damage or sending a key in the other form.
func TestOpenFormat10ReadsFormsUnrecorded(t *testing.T) {
	t.Parallel()
	old, err := os.ReadFile(filepath.Join("testdata", "journal-v1.0"))
	require.NoError(t, err)
	h, err := parseHeader(old)
	require.NoError(t, err)
	require.Equal(t, uint8(0), h.minor, "testdata: format 1.0")
	require.Zero(t, h.flags&^format10Flags, "testdata: format 1.0's flags")
	dir := writeJournal(t, old)

	s, rep := mustOpen(t, dir, testOpts())
	assert.Equal(t, 3, rep.Records)
	assert.True(t, rep.Compacted, "rewritten as format 1.1")
	un, err := s.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, un, 3)
	for i, want := range format10Records {
		copy(want.Fingerprint[:], want.ActionID)
		assert.Equal(t, want.ActionID, un[i].ActionID)
		assert.Equal(t, want.Key, un[i].Key)
		assert.Equal(t, journal.KeyFormUnrecorded, un[i].KeyForm, "%s: no form in a 1.0 file", want.ActionID)
		assert.True(t, want.CreatedAt.Equal(un[i].CreatedAt), want.ActionID)
		assert.Equal(t, want.State, un[i].State, want.ActionID)
		assert.Equal(t, want.Attempts, un[i].Attempts, want.ActionID)
		assert.Equal(t, want.Fingerprint, un[i].Fingerprint, want.ActionID)
	}

	now, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	h, err = parseHeader(now)
	require.NoError(t, err)
	assert.Equal(t, uint8(1), h.minor)
	assert.NotZero(t, h.flags&flagKeyForm)
	assert.NotZero(t, h.flags&^format10Flags, "a reader of format 1.0 must refuse the rewritten file")

	// New records carry their forms; the old ones stay unrecorded.
	e := entry("pay:order-4")
	e.KeyForm = journal.KeyFormQuoted
	reserve(t, s, e)
	require.NoError(t, s.Close())
	s, rep = mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.False(t, rep.Compacted, "a 1.1 file is not rewritten")
	for _, want := range []struct {
		id   string
		form journal.KeyForm
	}{{"pay:order-1", journal.KeyFormUnrecorded}, {"key:order-2-key", journal.KeyFormUnrecorded}, {"pay:order-4", journal.KeyFormQuoted}} {
		got, ok, err := s.get(want.id)
		require.NoError(t, err)
		require.True(t, ok, want.id)
		assert.Equal(t, want.form.String(), got.KeyForm.String(), want.id)
	}
}

// A 1.0 file that cannot be rewritten (a full disk: journal.tmp's write
// fails) fails Open and is left as it was: nothing is ever appended to a
// file of format 1.0, whose reader would take a form for damage. The next
// Open, with space, rewrites it.
func TestOpenFormat10NotRewrittenFailsUnchanged(t *testing.T) {
	t.Parallel()
	old, err := os.ReadFile(filepath.Join("testdata", "journal-v1.0"))
	require.NoError(t, err)
	dir := writeJournal(t, old)
	fail := new(sync.Map)
	fail.Store("short:"+tmpName, true)
	o := testOpts()
	o.hooks = faultyHooks(fail)
	_, _, err = openWith(dir, o)
	require.ErrorIs(t, err, errNoSpace)
	got, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	assert.Equal(t, old, got, "the 1.0 file was changed")
	fail.Delete("short:" + tmpName)
	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	assert.True(t, rep.Compacted)
	assert.Equal(t, 3, rep.Records)
}

// Each form is kept, in batches and in a compaction's snapshot, with UUID
// keys and custom ones, and a lazy Update (which rewrites the whole
// record) changes none.
func TestKeyFormKeptOnDisk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	forms := []journal.KeyForm{journal.KeyFormUnrecorded, journal.KeyFormBare, journal.KeyFormQuoted}
	want := map[string]journal.KeyForm{}
	for i := range 12 {
		e := entry(fmt.Sprintf("form-%d", i))
		if i%2 == 1 {
			e.Key = fmt.Sprintf("caller-key-%d", i) // a custom key
		}
		e.KeyForm = forms[i%3]
		reserve(t, s, e)
		want[e.ActionID] = e.KeyForm
		e.KeyForm = forms[(i+1)%3] // what Update stores not
		e.State, e.Attempts = journal.StatePending, 2
		require.NoError(t, s.Update(context.Background(), e))
	}
	check := func(s *Journal, when string) {
		t.Helper()
		for id, f := range want {
			got, ok, err := s.get(id)
			require.NoError(t, err)
			require.True(t, ok, "%s: %s", when, id)
			assert.Equal(t, f.String(), got.KeyForm.String(), "%s: %s", when, id)
		}
	}
	check(s, "open")
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	check(s, "reopened")
	require.NoError(t, s.Compact(context.Background()))
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, testOpts())
	defer s.Close()
	check(s, "compacted")
}

// The upsert's form bits at 3 (both set) are no form: in a frame whose
// CRC holds, damage.
func TestKeyFormThreeIsMalformed(t *testing.T) {
	t.Parallel()
	o := upsert(t, entry("f"))
	o.r.form = journal.KeyFormBare
	b := appendOp(nil, &o)
	require.Equal(t, byte(1<<upsertFormShift), b[1]&upsertForm)
	b[1] |= upsertForm
	var n int
	err := decodeOps(append([]byte{1}, b...), func(*op, []byte) error { n++; return nil })
	assert.ErrorIs(t, err, errPayload)
	assert.Zero(t, n)
}

// TestKeyFormKillChild is the child of TestKeyFormSurvivesKill: it
// reserves records under each form, UUID and custom keys alike, saying
// "ack <id> <form>" once each Reserve returned, and compacts now and then,
// until it is killed.
func TestKeyFormKillChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestKeyFormSurvivesKill")
	}
	o := testOpts()
	o.flushEvery = time.Hour
	c := openChild(os.Getenv(envDir), o)
	tag := os.Getenv(envTag)
	forms := []journal.KeyForm{journal.KeyFormUnrecorded, journal.KeyFormBare, journal.KeyFormQuoted}
	c.work(3, func(w *childWorker, i int) {
		e := entry(fmt.Sprintf("%s-%d-%d", tag, w.g, i))
		if i%2 == 1 {
			e.Key = fmt.Sprintf("caller-%s-%d-%d", tag, w.g, i)
		}
		e.KeyForm = forms[(w.g+i)%3]
		got, _, err := c.Reserve(context.Background(), e, journal.ReuseAny)
		if err != nil {
			c.fail(err)
		}
		c.say("ack %s %d", got.ActionID, got.KeyForm)
		if i%40 == 39 && w.g == 0 {
			if err := c.Compact(context.Background()); err != nil {
				c.fail(err)
			}
		}
	})
}

// A record's form survives a SIGKILL of its process and a reopen, over
// several rounds on one journal (each reopen replays batches and the
// snapshots of the child's compactions).
func TestKeyFormSurvivesKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	want := map[string]journal.KeyForm{}
	for round := range 4 {
		cmd, out := childtest.Start(t, "TestKeyFormKillChild", envDir+"="+dir, envTag+"="+fmt.Sprint("r", round))
		ls, err := killAfter(cmd, out, 1+60+40*round)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, "open", ls[0], "round %d", round)
		for _, l := range ls[1:] {
			f := strings.Fields(l)
			require.Len(t, f, 3, "round %d: child: %s", round, l)
			require.Equal(t, "ack", f[0], "round %d: child: %s", round, l)
			var form journal.KeyForm
			_, err := fmt.Sscan(f[2], &form)
			require.NoError(t, err)
			want[f[1]] = form
		}
		s, _ := mustOpen(t, dir, testOpts())
		for id, form := range want {
			got, ok, err := s.get(id)
			require.NoError(t, err)
			require.True(t, ok, "round %d: %s lost", round, id)
			assert.Equal(t, form.String(), got.KeyForm.String(), "round %d: %s's form", round, id)
		}
		require.NoError(t, s.Close())
	}
}
