// Package journaltest is the conformance suite for journal.Journal
// implementations, as testing/fstest.TestFS is for file systems: the
// semantics of journal.Memory, which every journal (the file journal, a SQL
// one, a Redis or key-value one of your own) must match. A journal's test
// runs it in one line, with a factory that returns a new, empty journal:
//
//	func TestConformance(t *testing.T) {
//		journaltest.Run(t, func(t *testing.T) journal.Journal { return myjournal.Open(t.TempDir()) })
//	}
//
// Options adapt it to documented deviations (ReportedIDs for journals that
// hash action ids) and add checks that need the journal's help (Stall, to
// prove that calls return by their context's deadline when the storage
// hangs).
package journaltest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// Factory returns a new, empty journal for one subtest. Run closes it (and
// tolerates a second Close by the factory's own cleanup).
type Factory func(t *testing.T) journal.Journal

// An Option adapts the suite to a journal's documented deviations.
type Option func(*suite)

type suite struct {
	// id maps an action id to the ActionID that Unfinished reports.
	id func(string) string
	// stall, if set, makes j's storage stop answering until release is
	// called (a row lock held elsewhere, a paused server).
	stall func(t *testing.T, j journal.Journal) (release func())
	// earlier is how much earlier than given a created record's CreatedAt
	// may be stored (EarlierCreatedAt).
	earlier time.Duration
	// open makes the journals of the run.
	open Factory
	// corrupt, if set, puts a record in j's storage as it is (Corrupt).
	corrupt func(t *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error)
}

// Corrupt lets the suite check that the journal never returns a record
// that journal.CheckRecord refuses, whatever its storage holds. corrupt
// must put rec in j's storage as it is, in place of the valid record of
// rec.ActionID that j holds, bypassing the journal's checks (an UPDATE of
// a SQL table, a record written into a journal file by the format's own
// encoder), and return the journal to read it through: j, or j reopened.
// If reopening refuses the storage, corrupt returns that error, which must
// wrap journal.ErrCorruptRecord. A value the storage cannot hold at all (a
// column or field too narrow for it) makes corrupt call t.Skip.
func Corrupt(corrupt func(t *testing.T, j journal.Journal, rec journal.Record) (journal.Journal, error)) Option {
	return func(s *suite) { s.corrupt = corrupt }
}

// EarlierCreatedAt says that the journal may store a record it creates
// with a CreatedAt earlier than the one given, by up to max, and returns
// and reads it back so: sqljournal stores the earlier of the given time and
// the database's clock, so that a machine whose clock runs ahead cannot
// make a key look younger to the others than it is. A later time is never
// accepted (it would make a key look younger: sent after its window).
func EarlierCreatedAt(max time.Duration) Option {
	return func(s *suite) { s.earlier = max }
}

// sameCreatedAt checks a record's CreatedAt against the one it was created
// with: equal, or earlier by up to s.earlier.
func (s *suite) sameCreatedAt(t *testing.T, want, got time.Time, msg string) {
	t.Helper()
	if s.earlier == 0 {
		assert.True(t, want.Equal(got), "%s: created %v != %v", msg, want, got)
		return
	}
	assert.False(t, got.After(want), "%s: created %v, later than %v", msg, got, want)
	assert.LessOrEqual(t, want.Sub(got), s.earlier, "%s: created %v, more than %v before %v", msg, got, s.earlier, want)
}

// Stall lets the suite check that a journal whose storage stops answering
// still returns from Reserve, Update and Forget by the context's deadline:
// stall must make j's storage hang (for a SQL journal, hold a lock on its
// table from another session) until release is called.
func Stall(stall func(t *testing.T, j journal.Journal) (release func())) Option {
	return func(s *suite) { s.stall = stall }
}

// ReportedIDs says that the journal's Unfinished reports id(ActionID)
// instead of ActionID (as a file journal with hashed ids does), and orders
// ties by the reported id.
func ReportedIDs(id func(string) string) Option {
	return func(s *suite) { s.id = id }
}

// Run runs the conformance suite against journals made by open.
func Run(t *testing.T, open Factory, opts ...Option) {
	s := &suite{id: func(id string) string { return id }, open: open}
	for _, o := range opts {
		o(s)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := open(t)
			defer j.Close()
			c.run(t, s, j)
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, s *suite, j journal.Journal)
}{
	{"ReserveCreatesThenReuses", reserveCreatesThenReuses},
	{"ReusePendingReplacesDone", reusePendingReplacesDone},
	{"UpdateAndNotFound", updateAndNotFound},
	{"UpdateMatchesKey", updateMatchesKey},
	{"DoneIsFinal", doneIsFinal},
	{"BoundedByContext", boundedByContext},
	{"UnfinishedOldestFirst", unfinishedOldestFirst},
	{"Forget", forget},
	{"Getter", getter},
	{"FingerprintKeeper", fingerprintKeeper},
	{"ReportedIDsResolve", reportedIDsResolve},
	{"CustomKeys", customKeys},
	{"KeyForm", keyForm},
	{"ConcurrentReservesOneKey", concurrentReservesOneKey},
	{"CanceledContext", canceledContext},
	{"Closed", closed},
	{"RefusesInvalidRecords", refusesInvalidRecords},
	{"CreatedAtBounds", createdAtBounds},
	{"NeverReturnsCorrupt", neverReturnsCorrupt},
	{"UnfinishedListsBesideCorrupt", unfinishedListsBesideCorrupt},
}

var ctx = context.Background()

// rec returns a fresh pending record, its key recorded quoted (so that a
// journal that drops the form fails every comparison, see same). Times are
// whole milliseconds, the precision journals are required to keep.
func rec(id string, created time.Time) journal.Record {
	r := journal.Record{ActionID: id, Key: uuid.NewString(), KeyForm: journal.KeyFormQuoted,
		CreatedAt: created.Truncate(time.Millisecond), State: journal.StatePending}
	copy(r.Fingerprint[:], id)
	return r
}

func now() time.Time { return time.Now().Truncate(time.Millisecond) }

func (s *suite) same(t *testing.T, want, got journal.Record, msg string) {
	t.Helper()
	assert.Equal(t, want.ActionID, got.ActionID, msg)
	assert.Equal(t, want.Key, got.Key, msg)
	assert.Equal(t, want.KeyForm.String(), got.KeyForm.String(), "%s: the key's form", msg)
	assert.Equal(t, want.Fingerprint, got.Fingerprint, msg)
	s.sameCreatedAt(t, want.CreatedAt, got.CreatedAt, msg)
	assert.Equal(t, want.State, got.State, msg)
	assert.Equal(t, want.Attempts, got.Attempts, msg)
	assert.Equal(t, want.Status, got.Status, msg)
}

func reserve(t *testing.T, j journal.Journal, r journal.Record, mode journal.ReserveMode) (journal.Record, bool) {
	t.Helper()
	got, created, err := j.Reserve(ctx, r, mode)
	require.NoError(t, err)
	require.NoError(t, journal.CheckRecord(got), "Reserve returned a record CheckRecord refuses")
	return got, created
}

func reserveCreatesThenReuses(t *testing.T, s *suite, j journal.Journal) {
	first := rec("a", now())
	got, created := reserve(t, j, first, journal.ReuseAny)
	assert.True(t, created)
	s.same(t, first, got, "created")
	got, created = reserve(t, j, rec("a", now().Add(time.Second)), journal.ReuseAny)
	assert.False(t, created)
	s.same(t, first, got, "reused")
	// ReuseAny keeps a done action's key.
	done := first
	done.State, done.Attempts, done.Status = journal.StateDone, 2, 201
	require.NoError(t, j.Update(ctx, done))
	got, created = reserve(t, j, rec("a", now()), journal.ReuseAny)
	assert.False(t, created)
	s.same(t, done, got, "reused done")
	// ReusePending keeps a pending action's key.
	p := rec("p", now())
	reserve(t, j, p, journal.ReusePending)
	got, created = reserve(t, j, rec("p", now()), journal.ReusePending)
	assert.False(t, created)
	s.same(t, p, got, "reused pending")
}

func reusePendingReplacesDone(t *testing.T, s *suite, j journal.Journal) {
	first := rec("a", now())
	reserve(t, j, first, journal.ReusePending)
	first.State, first.Status = journal.StateDone, 200
	require.NoError(t, j.Update(ctx, first))
	second := rec("a", now())
	got, created := reserve(t, j, second, journal.ReusePending)
	assert.True(t, created)
	s.same(t, second, got, "replaced")
	assert.NotEqual(t, first.Key, got.Key)
	// An unknown action is not done: it keeps its key.
	u := rec("u", now())
	reserve(t, j, u, journal.ReusePending)
	u.State = journal.StateUnknown
	require.NoError(t, j.Update(ctx, u))
	got, created = reserve(t, j, rec("u", now()), journal.ReusePending)
	assert.False(t, created)
	assert.Equal(t, u.Key, got.Key)
}

func updateAndNotFound(t *testing.T, s *suite, j journal.Journal) {
	r := rec("a", now())
	reserve(t, j, r, journal.ReuseAny)
	// Update stores State, Attempts and Status only.
	upd := r
	upd.State, upd.Attempts, upd.Status = journal.StateUnknown, 4, 0
	upd.CreatedAt = r.CreatedAt.Add(time.Hour)
	copy(upd.Fingerprint[:], "another fingerprint")
	require.NoError(t, j.Update(ctx, upd))
	got, _ := reserve(t, j, rec("a", now()), journal.ReuseAny)
	want := r
	want.State, want.Attempts = journal.StateUnknown, 4
	s.same(t, want, got, "updated")
	err := j.Update(ctx, rec("missing", now()))
	assert.ErrorIs(t, err, journal.ErrNotFound)
}

// updateMatchesKey: Update changes only the record of rec.ActionID whose key
// is rec.Key. A record replaced under ReusePending, or forgotten and created
// again, is another action under the same id: an update meant for the old
// one fails with ErrActionNotFound and leaves the new one alone.
func updateMatchesKey(t *testing.T, s *suite, j journal.Journal) {
	// Another key on the action's own record.
	r := rec("a", now())
	reserve(t, j, r, journal.ReuseAny)
	other := r
	other.Key = uuid.NewString()
	other.State, other.Attempts, other.Status = journal.StateDone, 3, 201
	assert.ErrorIs(t, j.Update(ctx, other), journal.ErrNotFound)
	got, _ := reserve(t, j, rec("a", now()), journal.ReuseAny)
	s.same(t, r, got, "other key")

	// Replaced under ReusePending.
	old := rec("p", now())
	reserve(t, j, old, journal.ReusePending)
	old.State, old.Attempts, old.Status = journal.StateDone, 1, 200
	require.NoError(t, j.Update(ctx, old))
	repl := rec("p", now())
	got, created := reserve(t, j, repl, journal.ReusePending)
	require.True(t, created)
	s.same(t, repl, got, "replacement")
	late := old
	late.State, late.Attempts, late.Status = journal.StateUnknown, 7, 0
	assert.ErrorIs(t, j.Update(ctx, late), journal.ErrNotFound)
	got, _ = reserve(t, j, rec("p", now()), journal.ReuseAny)
	s.same(t, repl, got, "replaced")

	// Forgotten and created again.
	f := rec("f", now())
	reserve(t, j, f, journal.ReuseAny)
	require.NoError(t, j.Forget(ctx, "f"))
	again := rec("f", now())
	reserve(t, j, again, journal.ReuseAny)
	f.State, f.Attempts, f.Status = journal.StateDone, 2, 201
	assert.ErrorIs(t, j.Update(ctx, f), journal.ErrNotFound)
	got, _ = reserve(t, j, rec("f", now()), journal.ReuseAny)
	s.same(t, again, got, "recreated")
	// The new record itself is updated as usual.
	again.State, again.Attempts, again.Status = journal.StateDone, 1, 201
	require.NoError(t, j.Update(ctx, again))
	got, _ = reserve(t, j, rec("f", now()), journal.ReuseAny)
	s.same(t, again, got, "updated")
}

// doneIsFinal: no Update moves a record out of StateDone or changes its
// Status. A stale writer (a second Transport that saw a 409, was cancelled
// and records "pending") must not undo an outcome another one recorded:
// for an action named by its fingerprint, the next deliberate repeat would
// reuse the old key and be answered with the first payment's replay.
func doneIsFinal(t *testing.T, _ *suite, j journal.Journal) {
	for _, late := range []journal.State{journal.StatePending, journal.StateUnknown, journal.StateDone} {
		id := "d-" + late.String()
		r := rec(id, now())
		reserve(t, j, r, journal.ReusePending)
		done := r
		done.State, done.Attempts, done.Status = journal.StateDone, 1, 201
		require.NoError(t, j.Update(ctx, done))
		stale := r
		stale.State, stale.Attempts, stale.Status = late, 2, 0
		if late == journal.StateDone {
			stale.Status = 500
		}
		if err := j.Update(ctx, stale); err != nil {
			// Refusing the stale update is allowed; changing the record is not.
			t.Logf("stale update to %v refused: %v", late, err)
		}
		got, _ := reserve(t, j, rec(id, now()), journal.ReuseAny)
		assert.Equal(t, journal.StateDone, got.State, "after a stale update to %v", late)
		assert.Equal(t, 201, got.Status, "after a stale update to %v", late)
		assert.Equal(t, r.Key, got.Key)
		unf, err := j.Unfinished(ctx)
		require.NoError(t, err)
		for _, u := range unf {
			assert.NotEqual(t, r.Key, u.Key, "a done record is not unfinished after a stale update to %v", late)
		}
		// Under ReusePending the done record is still replaced by a new action.
		got, created := reserve(t, j, rec(id, now()), journal.ReusePending)
		assert.True(t, created, "a deliberate repeat after a stale update to %v is a new action", late)
		assert.NotEqual(t, r.Key, got.Key)
	}
}

// boundedByContext: every call that takes a context returns by its deadline
// (plus a little for scheduling), even when the storage hangs (with Stall).
func boundedByContext(t *testing.T, s *suite, j journal.Journal) {
	r := rec("bound", now())
	reserve(t, j, r, journal.ReuseAny)
	if s.stall != nil {
		release := s.stall(t, j)
		defer release()
	}
	const deadline, slack = 300 * time.Millisecond, 700 * time.Millisecond
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Reserve", func(c context.Context) error {
			_, _, err := j.Reserve(c, rec("bound-new", now()), journal.ReuseAny)
			return err
		}},
		{"Update", func(c context.Context) error {
			u := r
			u.State, u.Attempts, u.Status = journal.StateDone, 1, 200
			return j.Update(c, u)
		}},
		{"Forget", func(c context.Context) error { return j.Forget(c, "bound-other") }},
		{"Unfinished", func(c context.Context) error { _, err := j.Unfinished(c); return err }},
	}
	for _, c := range calls {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		err := c.call(cctx)
		took := time.Since(start)
		cancel()
		assert.Less(t, took, deadline+slack, "%s took %v with a %v deadline (err %v)", c.name, took, deadline, err)
		if s.stall != nil && err == nil && c.name != "Update" {
			t.Errorf("%s succeeded although the storage was stalled", c.name)
		}
	}
}

func unfinishedOldestFirst(t *testing.T, s *suite, j journal.Journal) {
	t0 := now().Add(-time.Minute)
	states := map[string]journal.State{"d": journal.StateDone, "c": journal.StatePending, "b": journal.StateUnknown, "a": journal.StatePending, "e": journal.StatePending}
	created := map[string]time.Time{"a": t0.Add(2 * time.Second), "b": t0, "c": t0.Add(time.Second), "d": t0, "e": t0.Add(time.Second)}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		r := rec(id, created[id])
		reserve(t, j, r, journal.ReuseAny)
		if states[id] != journal.StatePending {
			r.State = states[id]
			require.NoError(t, j.Update(ctx, r))
		}
	}
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	var ids []string
	for _, r := range un {
		ids = append(ids, r.ActionID)
		assert.NotEmpty(t, r.Key)
	}
	// b is oldest, then c and e (a tie, broken by reported id), then a.
	c, e := s.id("c"), s.id("e")
	if e < c {
		c, e = e, c
	}
	assert.Equal(t, []string{s.id("b"), c, e, s.id("a")}, ids)
	for _, r := range un {
		for id, at := range created {
			if s.id(id) == r.ActionID {
				s.sameCreatedAt(t, at, r.CreatedAt, id)
			}
		}
	}
}

func forget(t *testing.T, _ *suite, j journal.Journal) {
	r := rec("a", now())
	reserve(t, j, r, journal.ReuseAny)
	require.NoError(t, j.Forget(ctx, "a"))
	require.NoError(t, j.Forget(ctx, "a"))
	require.NoError(t, j.Forget(ctx, "never"))
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	assert.Empty(t, un)
	assert.ErrorIs(t, j.Update(ctx, r), journal.ErrNotFound)
	got, created := reserve(t, j, rec("a", now()), journal.ReuseAny)
	assert.True(t, created)
	assert.NotEqual(t, r.Key, got.Key)
}

// getter: a journal that is a journal.Getter reads a record, by its id as
// given or as Unfinished reports it, without creating one: none before the
// Reserve, the record (its state as updated) after it, none after Forget.
func getter(t *testing.T, s *suite, j journal.Journal) {
	g, ok := j.(journal.Getter)
	if !ok {
		t.Skip("not a journal.Getter")
	}
	_, found, err := g.Get(ctx, "a")
	require.NoError(t, err)
	assert.False(t, found)
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	assert.Empty(t, un, "Get created a record")
	r := rec("a", now())
	reserve(t, j, r, journal.ReuseAny)
	r.State, r.Attempts = journal.StateUnknown, 2
	require.NoError(t, j.Update(ctx, r))
	for _, id := range []string{"a", s.id("a")} {
		got, found, err := g.Get(ctx, id)
		require.NoError(t, err)
		require.True(t, found, "Get(%q)", id)
		assert.Equal(t, r.Key, got.Key)
		assert.Equal(t, journal.StateUnknown, got.State)
		assert.Equal(t, 2, got.Attempts)
		assert.Equal(t, r.Fingerprint, got.Fingerprint)
	}
	require.NoError(t, j.Forget(ctx, "a"))
	_, found, err = g.Get(ctx, "a")
	require.NoError(t, err)
	assert.False(t, found)
}

// fingerprintKeeper: a journal that is a journal.FingerprintKeeper with a
// secret gives the same one, not all zero, on every call, and none for a
// journal that embeds it.
func fingerprintKeeper(t *testing.T, s *suite, j journal.Journal) {
	k, ok := j.(journal.FingerprintKeeper)
	if !ok {
		t.Skip("not a journal.FingerprintKeeper")
	}
	secret, ok := k.FingerprintSecret(j)
	if !ok {
		t.Skip("the journal has no fingerprint secret")
	}
	assert.NotEqual(t, [32]byte{}, secret, "an all-zero secret")
	again, ok := k.FingerprintSecret(j)
	require.True(t, ok)
	assert.Equal(t, secret, again, "the secret changed between calls")
	_, ok = k.FingerprintSecret(embedding{j})
	assert.False(t, ok, "a journal that embeds this one was given its secret")
}

// embedding is a journal that embeds another, as a wrapper does.
type embedding struct{ journal.Journal }

// reportedIDsResolve: the ActionID that Unfinished reports (see ReportedIDs)
// reaches the same record in Reserve, Update and Forget, so resuming a
// listed action never mints a second key for it.
func reportedIDsResolve(t *testing.T, s *suite, j journal.Journal) {
	r := rec("pay:order-17", now())
	reserve(t, j, r, journal.ReuseAny)
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	require.Len(t, un, 1)
	listed := un[0]
	assert.Equal(t, s.id(r.ActionID), listed.ActionID)

	got, created := reserve(t, j, rec(listed.ActionID, now()), journal.ReuseAny)
	assert.False(t, created, "Reserve of the reported id created a record")
	assert.Equal(t, r.Key, got.Key)

	listed.State, listed.Attempts = journal.StateUnknown, 2
	require.NoError(t, j.Update(ctx, listed), "Update of the reported id")
	got, created = reserve(t, j, r, journal.ReuseAny)
	assert.False(t, created)
	assert.Equal(t, journal.StateUnknown, got.State)
	assert.Equal(t, 2, got.Attempts)

	require.NoError(t, j.Forget(ctx, listed.ActionID))
	un, err = j.Unfinished(ctx)
	require.NoError(t, err)
	assert.Empty(t, un)
	got, created = reserve(t, j, rec(r.ActionID, now()), journal.ReuseAny)
	assert.True(t, created, "the record survived Forget of the reported id")
	assert.NotEqual(t, r.Key, got.Key)
}

func customKeys(t *testing.T, _ *suite, j journal.Journal) {
	for i, k := range []string{"k", "order-42:attempt/1~x", "8E03978E-40D5-43E8-BC93-6894A57F9324", string(make255())} {
		r := rec(fmt.Sprintf("c%d", i), now())
		r.Key, r.KeyForm = k, journal.KeyFormBare // the bare form holds every visible character
		reserve(t, j, r, journal.ReuseAny)
		got, created := reserve(t, j, rec(r.ActionID, now()), journal.ReuseAny)
		assert.False(t, created)
		assert.Equal(t, k, got.Key)
	}
}

// keyForm: a record keeps the form of its key (journal.KeyForm) as Reserve
// was given it, each of the three, through every read (Reserve, Get,
// Unfinished); a Reserve that finds the record returns the stored form,
// not the one it was given; Update leaves the form alone; a record that
// replaces a done one under ReusePending comes with its own. A journal
// that dropped the form would have a key sent in one form and, after a
// restart, in the other, which servers take for a second key.
func keyForm(t *testing.T, s *suite, j journal.Journal) {
	forms := []journal.KeyForm{journal.KeyFormUnrecorded, journal.KeyFormBare, journal.KeyFormQuoted}
	for i, f := range forms {
		id := "form-" + f.String()
		r := rec(id, now().Add(time.Duration(i)*time.Millisecond))
		r.KeyForm = f
		got, created := reserve(t, j, r, journal.ReuseAny)
		require.True(t, created)
		s.same(t, r, got, "created "+f.String())
		other := rec(id, now())
		other.KeyForm = forms[(i+1)%len(forms)]
		got, created = reserve(t, j, other, journal.ReusePending)
		assert.False(t, created)
		s.same(t, r, got, "reused "+f.String())
		upd := r
		upd.KeyForm = forms[(i+2)%len(forms)]
		upd.State, upd.Attempts = journal.StateUnknown, 3
		require.NoError(t, j.Update(ctx, upd))
		r.State, r.Attempts = journal.StateUnknown, 3
		got, _ = reserve(t, j, other, journal.ReuseAny)
		s.same(t, r, got, "updated "+f.String())
		if g, ok := j.(journal.Getter); ok {
			got, found, err := g.Get(ctx, id)
			require.NoError(t, err)
			require.True(t, found)
			assert.Equal(t, f.String(), got.KeyForm.String(), "Get: the key's form")
		}
	}
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	require.Len(t, un, len(forms))
	for i, f := range forms {
		assert.Equal(t, s.id("form-"+f.String()), un[i].ActionID)
		assert.Equal(t, f.String(), un[i].KeyForm.String(), "Unfinished: the key's form")
	}

	// A done record replaced under ReusePending: the new key, the new form.
	done := rec("form-replaced", now())
	reserve(t, j, done, journal.ReusePending)
	done.State, done.Attempts, done.Status = journal.StateDone, 1, 201
	require.NoError(t, j.Update(ctx, done))
	next := rec("form-replaced", now())
	next.KeyForm = journal.KeyFormBare
	got, created := reserve(t, j, next, journal.ReusePending)
	require.True(t, created)
	s.same(t, next, got, "replaced")
	got, _ = reserve(t, j, rec("form-replaced", now()), journal.ReuseAny)
	s.same(t, next, got, "replaced, read again")
}

func make255() []byte {
	b := make([]byte, 255)
	for i := range b {
		b[i] = byte('!' + i%94)
	}
	return b
}

func concurrentReservesOneKey(t *testing.T, _ *suite, j journal.Journal) {
	const n = 100
	var wg sync.WaitGroup
	keys := make([]string, n)
	var mu sync.Mutex
	creators := 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, created, err := j.Reserve(ctx, rec("same", now()), journal.ReuseAny)
			if !assert.NoError(t, err) {
				return
			}
			keys[i] = got.Key
			if created {
				mu.Lock()
				creators++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, creators)
	for _, k := range keys {
		assert.Equal(t, keys[0], k)
	}
}

func canceledContext(t *testing.T, _ *suite, j journal.Journal) {
	c, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err := j.Reserve(c, rec("a", now()), journal.ReuseAny)
	assert.ErrorIs(t, err, context.Canceled)
}

func closed(t *testing.T, _ *suite, j journal.Journal) {
	r := rec("a", now())
	reserve(t, j, r, journal.ReuseAny)
	require.NoError(t, j.Close())
	require.NoError(t, j.Close(), "second Close")
	_, _, err := j.Reserve(ctx, rec("b", now()), journal.ReuseAny)
	assert.ErrorIs(t, err, journal.ErrClosed)
	assert.ErrorIs(t, j.Update(ctx, r), journal.ErrClosed)
	_, err = j.Unfinished(ctx)
	assert.ErrorIs(t, err, journal.ErrClosed)
	assert.ErrorIs(t, j.Forget(ctx, "a"), journal.ErrClosed)
	assert.False(t, errors.Is(err, journal.ErrNotFound))
}

// invalid returns records that journal.CheckRecord refuses, each a valid
// pending record of id with one thing wrong, by what is wrong.
func invalid(id string) []struct {
	name string
	rec  journal.Record
} {
	base := rec(id, now())
	with := func(f func(*journal.Record)) journal.Record {
		r := base
		f(&r)
		return r
	}
	return []struct {
		name string
		rec  journal.Record
	}{
		{"EmptyKey", with(func(r *journal.Record) { r.Key = "" })},
		{"KeyWithSpace", with(func(r *journal.Record) { r.Key = "a b" })},
		{"KeyWithControlByte", with(func(r *journal.Record) { r.Key = "k\x01" })},
		{"KeyTooLong", with(func(r *journal.Record) { r.Key = string(make255()) + "!" })},
		{"NegativeAttempts", with(func(r *journal.Record) { r.Attempts = -1 })},
		{"AttemptsOverMax", with(func(r *journal.Record) { r.Attempts = int(attemptsOverMax) })},
		{"NegativeStatus", with(func(r *journal.Record) { r.Status = -1 })},
		{"KeyFormThree", with(func(r *journal.Record) { r.KeyForm = 3 })},
		{"QuotedKeyWithQuote", with(func(r *journal.Record) { r.Key, r.KeyForm = `a"b`, journal.KeyFormQuoted })},
		{"QuotedKeyWithBackslash", with(func(r *journal.Record) { r.Key, r.KeyForm = `a\b`, journal.KeyFormQuoted })},
		{"StateZero", with(func(r *journal.Record) { r.State = 0 })},
		{"StateFour", with(func(r *journal.Record) { r.State = 4 })},
		{"CreatedAtZero", with(func(r *journal.Record) { r.CreatedAt = time.Time{} })},
		{"CreatedAtMinInt64", with(func(r *journal.Record) { r.CreatedAt = time.UnixMilli(math.MinInt64) })},
		{"CreatedAtBeforeMin", with(func(r *journal.Record) { r.CreatedAt = time.UnixMilli(journal.MinCreatedAtUnixMilli - 1) })},
		{"CreatedAtAfterMax", with(func(r *journal.Record) { r.CreatedAt = time.UnixMilli(journal.MaxCreatedAtUnixMilli + 1) })},
	}
}

// attemptsOverMax is one over journal.MaxAttempts, a variable so that the
// suite compiles where an int is 32 bits (GOARCH 386, arm: Android's
// armeabi-v7a), where it converts to a negative int: no int is over
// journal.MaxAttempts there.
var attemptsOverMax int64 = journal.MaxAttempts + 1

// refusesInvalidRecords: Reserve refuses, with journal.ErrInvalidRecord,
// a record that journal.CheckRecord refuses, and stores nothing of it;
// Update refuses progress that journal.CheckProgress refuses, and changes
// nothing. (A record stored with an empty key was sent without an
// Idempotency-Key; one whose attempts could not grow could never record its
// outcome.)
func refusesInvalidRecords(t *testing.T, s *suite, j journal.Journal) {
	for _, c := range invalid("bad") {
		require.Error(t, journal.CheckRecord(c.rec), "%s: the suite's own record is valid", c.name)
		_, _, err := j.Reserve(ctx, c.rec, journal.ReuseAny)
		assert.ErrorIs(t, err, journal.ErrInvalidRecord, "Reserve of a record with %s", c.name)
	}
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	assert.Empty(t, un, "a refused record was stored")
	if g, ok := j.(journal.Getter); ok {
		_, found, err := g.Get(ctx, "bad")
		require.NoError(t, err)
		assert.False(t, found, "a refused record was stored")
	}
	r := rec("good", now())
	reserve(t, j, r, journal.ReuseAny)
	for _, c := range invalid("good") {
		if journal.CheckProgress(c.rec) == nil {
			continue // what Update does not store
		}
		upd := r
		upd.State, upd.Attempts, upd.Status = c.rec.State, c.rec.Attempts, c.rec.Status
		assert.ErrorIs(t, j.Update(ctx, upd), journal.ErrInvalidRecord, "Update with %s", c.name)
	}
	got, _ := reserve(t, j, rec("good", now()), journal.ReuseAny)
	s.same(t, r, got, "after refused updates")
}

// createdAtBounds: a CreatedAt at either bound (journal.MinCreatedAtUnixMilli,
// journal.MaxCreatedAtUnixMilli) is stored (at the upper one, or earlier,
// with EarlierCreatedAt); attempts at journal.MaxAttempts are stored, and
// read back so.
func createdAtBounds(t *testing.T, s *suite, j journal.Journal) {
	for _, at := range []int64{journal.MinCreatedAtUnixMilli, journal.MaxCreatedAtUnixMilli} {
		r := rec(fmt.Sprint("at", at), time.UnixMilli(at))
		got, created := reserve(t, j, r, journal.ReuseAny)
		require.True(t, created)
		if s.earlier == 0 || at == journal.MinCreatedAtUnixMilli {
			assert.True(t, r.CreatedAt.Equal(got.CreatedAt), "created %v, read back %v", r.CreatedAt, got.CreatedAt)
		}
		r.Attempts = journal.MaxAttempts
		require.NoError(t, j.Update(ctx, r))
		got, _ = reserve(t, j, rec(r.ActionID, now()), journal.ReuseAny)
		assert.Equal(t, journal.MaxAttempts, got.Attempts)
	}
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	assert.Len(t, un, 2)
}

// neverReturnsCorrupt (with Corrupt): a stored record that
// journal.CheckRecord refuses is never returned. Reserve and Get of its
// action fail with journal.ErrCorruptRecord (Reserve creates nothing in its
// place: the action may have been sent under its key), Unfinished names it
// in a *journal.CorruptRecordsError or leaves it out (only if its state is
// StateDone: one of a state no journal writes, 0 or 4, may have been
// pending, and must not drop out of Resume unnamed), and Forget removes
// it: the action's next Reserve creates a new record. Each record is put
// in a journal of its own.
func neverReturnsCorrupt(t *testing.T, s *suite, _ journal.Journal) {
	if s.corrupt == nil {
		t.Skip("no Corrupt option: the suite cannot put a record in the journal's storage")
	}
	for _, c := range invalid("corrupt") {
		t.Run(c.name, func(t *testing.T) {
			j := s.open(t)
			defer func() { j.Close() }()
			id := "corrupt-" + c.name
			reserve(t, j, rec(id, now()), journal.ReuseAny)
			bad := c.rec
			bad.ActionID = id
			j2, err := s.corrupt(t, j, bad)
			if err != nil {
				assert.ErrorIs(t, err, journal.ErrCorruptRecord, "reopening refused the storage holding a record with %s", c.name)
				return
			}
			j = j2
			for _, mode := range []journal.ReserveMode{journal.ReuseAny, journal.ReusePending} {
				got, created, err := j.Reserve(ctx, rec(id, now()), mode)
				assert.ErrorIs(t, err, journal.ErrCorruptRecord, "Reserve (mode %d) of a stored record with %s: %+v, created %v", mode, c.name, got, created)
				assert.False(t, created, "Reserve replaced a stored record with %s", c.name)
			}
			if g, ok := j.(journal.Getter); ok {
				got, found, err := g.Get(ctx, id)
				assert.ErrorIs(t, err, journal.ErrCorruptRecord, "Get of a stored record with %s: %+v, found %v", c.name, got, found)
			}
			un, err := j.Unfinished(ctx)
			if err == nil && bad.State != journal.StateDone {
				t.Errorf("Unfinished with a stored record not done (state %d) with %s: %d records, no error; want journal.ErrCorruptRecord", bad.State, c.name, len(un))
			}
			if err != nil {
				assert.ErrorIs(t, err, journal.ErrCorruptRecord, "Unfinished with a stored record with %s", c.name)
				s.namesCorrupt(t, err, []string{id}, c.name)
			}
			for _, r := range un {
				assert.NoError(t, journal.CheckRecord(r), "Unfinished returned a record CheckRecord refuses")
			}
			require.NoError(t, j.Forget(ctx, id), "Forget of a stored record with %s", c.name)
			got, created := reserve(t, j, rec(id, now()), journal.ReuseAny)
			assert.True(t, created, "after Forget: %+v", got)
		})
	}
}

// namesCorrupt checks that err, from Unfinished, wraps a
// *journal.CorruptRecordsError naming exactly ids (as Unfinished reports
// them), each with a reason wrapping journal.ErrCorruptRecord, and
// nothing else: no other sentinel of package journal.
func (s *suite) namesCorrupt(t *testing.T, err error, ids []string, what string) {
	t.Helper()
	var ce *journal.CorruptRecordsError
	if !errors.As(err, &ce) {
		t.Errorf("Unfinished with %s: %v, want a *journal.CorruptRecordsError naming the corrupt records", what, err)
		return
	}
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = s.id(id)
	}
	assert.ElementsMatch(t, want, ce.IDs, "Unfinished with %s: the corrupt records named", what)
	for i := range ce.IDs {
		assert.ErrorIs(t, ce.Reason(i), journal.ErrCorruptRecord, "Unfinished with %s: the reason of %s", what, ce.IDs[i])
	}
	for _, other := range []error{journal.ErrClosed, journal.ErrUnavailable, journal.ErrNotFound, journal.ErrInvalidRecord, journal.ErrIncompatible} {
		assert.NotErrorIs(t, err, other, "Unfinished with %s: the list is complete but for the corrupt records", what)
	}
}

// unfinishedListsBesideCorrupt (with Corrupt): corrupt unfinished records
// beside intact ones do not hide them. Unfinished returns the intact ones,
// oldest first, with an error wrapping a *journal.CorruptRecordsError that
// names every corrupt one (not only the first) as Forget accepts it; once
// each is forgotten by that id, Unfinished lists the intact ones with no
// error, and a Reserve of a forgotten action creates a new record.
func unfinishedListsBesideCorrupt(t *testing.T, s *suite, j journal.Journal) {
	if s.corrupt == nil {
		t.Skip("no Corrupt option: the suite cannot put a record in the journal's storage")
	}
	t0 := now().Add(-time.Minute)
	var intact []journal.Record
	var corrupt []journal.Record
	for i, id := range []string{"intact-1", "corrupt-key", "intact-2", "corrupt-attempts", "intact-3", "corrupt-unknown"} {
		r := rec(id, t0.Add(time.Duration(i)*time.Second))
		reserve(t, j, r, journal.ReuseAny)
		if id == "intact-2" || id == "corrupt-unknown" {
			r.State = journal.StateUnknown
			require.NoError(t, j.Update(ctx, r))
		}
		switch id {
		case "corrupt-attempts":
			r.Attempts = -1
		case "corrupt-key":
			r.Key = ""
		case "corrupt-unknown":
			r.Key = "a b"
		default:
			intact = append(intact, r)
			continue
		}
		corrupt = append(corrupt, r)
	}
	ids := make([]string, len(corrupt))
	for i, bad := range corrupt {
		ids[i] = bad.ActionID
		j2, err := s.corrupt(t, j, bad)
		if err != nil {
			assert.ErrorIs(t, err, journal.ErrCorruptRecord, "reopening refused the storage holding %+v", bad)
			return // the journal refuses its storage whole: it has nothing to list
		}
		j = j2
	}
	defer func() { j.Close() }()

	un, err := j.Unfinished(ctx)
	require.Error(t, err, "Unfinished beside %d corrupt records", len(corrupt))
	assert.ErrorIs(t, err, journal.ErrCorruptRecord)
	s.namesCorrupt(t, err, ids, "corrupt records beside intact ones")
	require.Len(t, un, len(intact), "Unfinished beside corrupt records: %+v", un)
	for i := range intact {
		want := intact[i]
		want.ActionID = s.id(want.ActionID)
		s.same(t, want, un[i], "listed beside corrupt records")
	}

	var ce *journal.CorruptRecordsError
	require.ErrorAs(t, err, &ce)
	for _, id := range ce.IDs {
		require.NoError(t, j.Forget(ctx, id), "Forget of %s, as Unfinished named it", id)
	}
	un, err = j.Unfinished(ctx)
	require.NoError(t, err, "Unfinished once the corrupt records were forgotten")
	assert.Len(t, un, len(intact))
	for _, bad := range corrupt {
		got, created := reserve(t, j, rec(bad.ActionID, now()), journal.ReuseAny)
		assert.True(t, created, "after Forget: %+v", got)
	}
}
