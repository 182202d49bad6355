package filejournal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of Open's recovery (open.go): torn tails and their copies aside,
// truncation and bit flips at every offset, salvage, the read window,
// journal.tmp left over, duplicated frames, expiry at Open.

// checkPrefix asserts that s holds exactly the first n entries of es.
func checkPrefix(t *testing.T, s *Journal, es []journal.Record, n int, msg string) {
	t.Helper()
	for i, e := range es {
		got, ok, err := s.get(e.ActionID)
		require.NoError(t, err)
		if i < n {
			if assert.True(t, ok, "%s: entry %d missing", msg, i) {
				assert.Equal(t, e.Key, got.Key, msg)
			}
		} else {
			assert.False(t, ok, "%s: entry %d should not exist", msg, i)
		}
	}
}

// T3: a crash can cut the file anywhere in the frames being written. Every
// prefix comes back with the records of its whole frames, no error, and the
// journal accepts appends afterwards.
func TestTruncateEveryOffset(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 6)
	offs := frameOffsets(t, data)
	require.Len(t, offs, 7) // the empty snapshot's end frame, then 6 records
	for cut := offs[4]; cut < len(data); cut++ {
		whole := 0 // records in frames entirely before cut
		for i := 1; i < len(offs); i++ {
			end := len(data)
			if i+1 < len(offs) {
				end = offs[i+1]
			}
			if end <= cut {
				whole = i
			}
		}
		dir := writeJournal(t, data[:cut])
		s, rep, err := openWith(dir, testOpts())
		require.NoError(t, err, "cut %d", cut)
		assert.Equal(t, cut != offs[whole+1], rep.TornTail, "cut %d", cut)
		checkPrefix(t, s, es, whole, "cut")
		if cut%5 == 0 {
			reserve(t, s, entry("after"))
			require.NoError(t, s.Close())
			s, _ = mustOpen(t, dir, testOpts())
			_, ok, _ := s.get("after")
			assert.True(t, ok, "append after recovery from cut %d", cut)
		}
		require.NoError(t, s.Close())
	}
}

// T4: what a crash can leave after the last whole frame is torn, never
// corruption, and is copied aside.
func TestTailModels(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	last := offs[len(offs)-1]
	garbage := make([]byte, 200)
	for i := range garbage {
		garbage[i] = byte(i*7 + 3)
	}
	halfZeroed := append([]byte(nil), data...)
	for i := last + (len(data)-last)/2; i < len(data); i++ {
		halfZeroed[i] = 0
	}
	models := map[string]struct {
		file  []byte
		whole int
	}{
		"zeros":              {append(append([]byte(nil), data...), make([]byte, 4096)...), 5},
		"garbage":            {append(append([]byte(nil), data...), garbage...), 5},
		"stale frame":        {append(append([]byte(nil), data...), data[offs[2]:offs[3]]...), 5},
		"last frame zeroed":  {halfZeroed, 4},
		"last header zeroed": {append(append([]byte(nil), data[:last]...), make([]byte, len(data)-last)...), 4},
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			dir := writeJournal(t, m.file)
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.True(t, rep.TornTail)
			checkPrefix(t, s, es, m.whole, name)
			aside, err := os.ReadFile(rep.TornCopy)
			require.NoError(t, err)
			assert.Equal(t, m.file[rep.TornOffset:], aside)
		})
	}
}

// T5: a flipped bit in a frame that later frames follow is damage to
// acknowledged data: refused, naming the frame's offset.
func TestBitFlipInNonFinalFrame(t *testing.T) {
	t.Parallel()
	data, _ := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	start, end := offs[2], offs[3]
	for i := start; i < end; i++ {
		d := flipBit(data, i, uint(i%8))
		dir := writeJournal(t, d)
		_, _, err := openWith(dir, testOpts())
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce, "flip at %d", i)
		assert.ErrorIs(t, err, ErrCorrupt)
		assert.Equal(t, int64(start), ce.Offset, "flip at %d", i)
		assert.Equal(t, filepath.Join(dir, journalName), ce.Path)
		// Refusing changes nothing on disk.
		after, _ := os.ReadFile(filepath.Join(dir, journalName))
		assert.True(t, bytes.Equal(d, after))
	}
}

func TestHeaderFlips(t *testing.T) {
	t.Parallel()
	data, _ := buildJournal(t, 2)
	for i := range headerSize {
		dir := writeJournal(t, flipBit(data, i, uint(i%8)))
		_, _, err := openWith(dir, testOpts())
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce, "flip at %d", i)
		assert.Equal(t, int64(0), ce.Offset)
	}
	// A valid header of an unknown major version is refused as such.
	d := append([]byte(nil), data...)
	d[8] = 2
	binary.LittleEndian.PutUint32(d[28:], crcOf(d[:28]))
	_, _, err := openWith(writeJournal(t, d), testOpts())
	assert.ErrorIs(t, err, journal.ErrIncompatible)
	assert.NotErrorIs(t, err, ErrCorrupt)
}

// Length flips are bounded: no allocation follows a huge length.
func TestLengthFlipsBounded(t *testing.T) {
	data, _ := buildJournal(t, 4)
	offs := frameOffsets(t, data)
	for _, n := range []uint32{0xffffffff, 0x7fffffff, maxPayload + 1, 1 << 30} {
		d := append([]byte(nil), data...)
		binary.LittleEndian.PutUint32(d[offs[2]+4:], n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, err := openWith(writeJournal(t, d), testOpts())
		runtime.ReadMemStats(&after)
		var ce *CorruptionError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, int64(offs[2]), ce.Offset)
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "length %#x", n)
	}
}

func TestSalvage(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	d := flipBit(data, offs[3]+20, 3) // frame 3 holds es[2]
	dir := writeJournal(t, d)
	_, _, err := openWith(dir, testOpts())
	require.ErrorIs(t, err, ErrCorrupt)

	o := testOpts()
	o.salvage = true
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	require.Len(t, rep.Salvaged, 1)
	assert.Equal(t, int64(offs[3]), rep.Salvaged[0].Offset)
	assert.Equal(t, int64(offs[4]-offs[3]), rep.Salvaged[0].Length)
	assert.True(t, rep.Compacted)
	aside, err := os.ReadFile(rep.CorruptCopy)
	require.NoError(t, err)
	assert.Equal(t, d, aside)
	for i, e := range es {
		got, ok, _ := s.get(e.ActionID)
		if i == 2 {
			assert.False(t, ok)
			continue
		}
		require.True(t, ok)
		assert.Equal(t, e.Key, got.Key)
	}
	require.NoError(t, s.Close())
	// The rewrite removed the damage: a plain open works.
	s, _ = mustOpen(t, dir, testOpts())
	require.NoError(t, s.Close())
}

// A bit flipped in the key of one record's frame, with intact frames after
// it: Open refuses the file, naming the action; a salvage opens it, and
// until the action is forgotten its Unfinished names the action in a
// *journal.CorruptRecordsError beside the intact records, and Reserve and
// Get of it fail with journal.ErrCorruptRecord (it may have been sent
// under the lost key: nothing is created in its place). Before, the
// salvage lost the record with no trace but an offset, and the next
// Reserve of the action made it anew under another key.
func TestSalvageNamesTheLostAction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) {
			o := testOpts()
			o.hashed = hashed
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, o)
			for i := range 5 {
				reserve(t, s, entry(fmt.Sprintf("action-%03d", i)))
			}
			require.NoError(t, s.Close())
			path := filepath.Join(dir, journalName)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			offs := frameOffsets(t, data)
			stored := []byte(s.storedID("action-002"))
			at := offs[3] + bytes.LastIndex(data[offs[3]:offs[4]], stored) + len(stored) // its upsert's key
			require.NoError(t, os.WriteFile(path, flipBit(data, at, 5), 0o600))
			lost := s.reportedID(string(stored))

			_, _, err = openWith(dir, o)
			var ce *CorruptionError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, []string{lost}, ce.Actions, "the actions of the damaged frame")
			assert.Contains(t, err.Error(), fmt.Sprintf("%q", lost), "the message names them (a mobile app has only the message)")

			o.salvage = true
			s, rep := mustOpen(t, dir, o)
			defer s.Close()
			require.Len(t, rep.Salvaged, 1)
			assert.Equal(t, []string{lost}, rep.Salvaged[0].Actions)
			un, err := s.Unfinished(ctx)
			assert.Len(t, un, 4, "the intact records")
			var bad *journal.CorruptRecordsError
			require.ErrorAs(t, err, &bad)
			assert.ErrorIs(t, err, journal.ErrCorruptRecord)
			assert.Equal(t, []string{lost}, bad.IDs)
			assert.ErrorIs(t, bad.Reason(0), ErrCorrupt)
			assert.Contains(t, err.Error(), fmt.Sprintf("offset %d", offs[3]), "where it was lost")
			_, _, err = s.Reserve(ctx, entry("action-002"), journal.ReuseAny)
			assert.ErrorIs(t, err, journal.ErrCorruptRecord, "Reserve of the lost action")
			_, _, err = s.Get(ctx, lost)
			assert.ErrorIs(t, err, journal.ErrCorruptRecord, "Get of the lost action")

			require.NoError(t, s.Forget(ctx, bad.IDs[0]), "Forget by the id Unfinished named")
			un, err = s.Unfinished(ctx)
			require.NoError(t, err)
			assert.Len(t, un, 4)
			_, created, err := s.Reserve(ctx, entry("action-002"), journal.ReuseAny)
			require.NoError(t, err)
			assert.True(t, created, "once forgotten, the action is made anew")
		})
	}
}

func TestHashedFlagMismatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	o := testOpts()
	o.hashed = true
	s, _ := mustOpen(t, dir, o)
	require.NoError(t, s.Close())
	_, _, err := openWith(dir, testOpts())
	assert.ErrorIs(t, err, journal.ErrIncompatible)
	s, _ = mustOpen(t, dir, o)
	require.NoError(t, s.Close())
}

// T8 (in process): the states a compaction crash can leave. A complete
// journal.tmp is adopted when journal is missing or journal.tmp starts past
// journal's last frame (its rename was lost, and later appends may be in
// it); it is removed when journal went on past its base (a stale leftover)
// or when it is incomplete.
func TestCompactionLeftovers(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 3)
	// A complete snapshot, as a compaction writes it.
	snapDir := t.TempDir()
	s, _ := mustOpen(t, snapDir, testOpts())
	for _, e := range es {
		reserve(t, s, e)
	}
	require.NoError(t, s.Compact(context.Background()))
	snap, err := os.ReadFile(filepath.Join(snapDir, journalName))
	require.NoError(t, err)
	// The same file after an acknowledged append: a snapshot followed by
	// a batch frame.
	reserve(t, s, entry("after-compaction"))
	require.NoError(t, s.Close())
	later, err := os.ReadFile(filepath.Join(snapDir, journalName))
	require.NoError(t, err)
	require.True(t, snapshotComplete(snap, "snap"))
	require.False(t, snapshotComplete(snap[:len(snap)-1], "snap"))
	require.True(t, snapshotComplete(later, "later"))
	require.True(t, snapshotComplete(later[:len(later)-1], "later"), "a torn append after the end record")

	cases := []struct {
		name            string
		journal, tmp    []byte
		adopted, remove bool
		records         int
	}{
		{"renamed not yet", nil, snap, true, false, 3},
		{"rename lost, appends under tmp", nil, later, true, false, 4},
		{"rename lost, old journal kept", data, later, true, false, 4},
		{"tmp starts past journal", data, snap, true, false, 3},
		{"rename done, tmp stale", later, snap, false, true, 4},
		{"tmp incomplete, journal missing", nil, snap[:len(snap)-3], false, true, 0},
		{"tmp incomplete, journal present", data, snap[:40], false, true, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.journal != nil {
				require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), c.journal, 0o600))
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, tmpName), c.tmp, 0o600))
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, c.adopted, rep.AdoptedTemp)
			assert.Equal(t, c.remove, rep.RemovedTemp)
			assert.Equal(t, c.records, rep.Records)
			_, err = os.Stat(filepath.Join(dir, tmpName))
			assert.True(t, errors.Is(err, os.ErrNotExist))
		})
	}
}

// Adversarial tests of the windowed recovery (source, countLive, replay into
// the slab): journals larger than several windows, frames of the largest
// payload straddling the window's edges, ids of journal.MaxActionID bytes.

// craftedID returns an id of exactly journal.MaxActionID bytes whose every
// part depends on tag and i (so ids sharing a prefix still differ late).
func craftedID(tag string, i int) string {
	p := fmt.Sprintf("%s-%d-", tag, i)
	var b strings.Builder
	b.WriteString(p)
	for b.Len() < journal.MaxActionID {
		fmt.Fprintf(&b, "%x", sha256.Sum256([]byte(fmt.Sprint(p, b.Len()))))
	}
	return b.String()[:journal.MaxActionID]
}

// refModel replays ops by the rules of the package doc, written out
// independently of replay: a delete removes; an upsert with the record's
// key (a UUID as bytes, another key as is) updates it, done being final
// and attempts never going down; any other upsert replaces it.
type refModel map[string]rec

func (m refModel) apply(ops []op) {
	for _, o := range ops {
		switch o.kind {
		case opUpsert:
			old, ok := m[o.r.id]
			if ok && old.custom == o.r.custom && (o.r.custom != "" || old.key == o.r.key) {
				if old.state != journal.StateDone {
					old.state, old.status = o.r.state, o.r.status
				}
				old.attempts = max(old.attempts, o.r.attempts)
				m[o.r.id] = old
				continue
			}
			m[o.r.id] = o.r
		case opDelete:
			delete(m, o.r.id)
		}
	}
}

// craftedFile is a crafted journal file and the operations of its frames.
type craftedFile struct {
	data   []byte
	frames [][]op // frame i has sequence i+1
	offs   []int  // start of frame i; offs[len(frames)] is the file's end
	ids    []string
}

// model returns the records of replaying the frames for which keep is true.
func (f *craftedFile) model(keep func(i int) bool) refModel {
	m := refModel{}
	for i, fr := range f.frames {
		if keep(i) {
			m.apply(fr)
		}
	}
	return m
}

// craftFile writes a journal of frames of every size, several of the
// largest payload, whose records have ids of journal.MaxActionID bytes:
// creations (a delete then an upsert, as Reserve writes them), updates with
// the same key (stale ones after done among them), replacements under
// another key, custom keys, forgets, creations again after a forget.
func craftFile(t testing.TB, seed uint64) *craftedFile {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	const gen = 0xfeed1234
	f := &craftedFile{}
	live := refModel{}
	var liveIDs []string
	pos := map[string]int{} // where each id is in liveIDs
	now := time.Now().UnixMilli()
	newRec := func(id string) rec {
		r := rec{id: id, created: now - int64(rng.IntN(1000)), state: journal.StatePending, attempts: uint32(rng.IntN(3))}
		if rng.IntN(6) == 0 {
			r.custom = fmt.Sprintf("custom-%d-%d", seed, rng.Uint64())
		} else {
			for i := range r.key {
				r.key[i] = byte(rng.Uint32())
			}
		}
		for i := range r.fp {
			r.fp[i] = byte(rng.Uint32())
		}
		return r
	}
	pick := func() (string, bool) {
		if len(liveIDs) == 0 {
			return "", false
		}
		return liveIDs[rng.IntN(len(liveIDs))], true
	}
	nextID := 0
	// How many operations each frame holds: single ones, a few, and as
	// many as the largest payload takes (about 960 of these), so that
	// whole-window frames start at every kind of offset.
	sizes := []int{1, 2, 2000, 1, 7, 2000, 3, 1, 40, 2000, 1, 2}
	for _, want := range sizes {
		var ops []op
		size := 0 // the encoded operations' size
		for len(ops) < want {
			var add []op
			switch k := rng.IntN(10); {
			case k < 5 || len(liveIDs) < 10: // a creation
				id := craftedID(fmt.Sprint("c", seed), nextID)
				nextID++
				f.ids = append(f.ids, id)
				add = []op{{kind: opDelete, r: rec{id: id}}, {kind: opUpsert, r: newRec(id)}}
			case k < 8: // an update with the same key, maybe stale
				id, _ := pick()
				r := live[id]
				r.state = journal.State(1 + rng.IntN(3))
				r.attempts = uint32(rng.IntN(6))
				r.status = uint16(200 + rng.IntN(300))
				add = []op{{kind: opUpsert, r: r}}
			case k == 8: // a replacement under another key
				id, _ := pick()
				add = []op{{kind: opDelete, r: rec{id: id}}, {kind: opUpsert, r: newRec(id)}}
			default: // a forget
				id, _ := pick()
				add = []op{{kind: opDelete, r: rec{id: id}}}
			}
			n := 0
			for i := range add {
				n += len(appendOp(nil, &add[i]))
			}
			if size+n+binary.MaxVarintLen64 > maxPayload {
				break
			}
			ops, size = append(ops, add...), size+n
			live.apply(add)
			for _, o := range add { // keep liveIDs the ids of live
				_, in := live[o.r.id]
				at, listed := pos[o.r.id]
				switch {
				case in && !listed:
					pos[o.r.id] = len(liveIDs)
					liveIDs = append(liveIDs, o.r.id)
				case !in && listed:
					last := liveIDs[len(liveIDs)-1]
					liveIDs[at], pos[last] = last, at
					liveIDs = liveIDs[:len(liveIDs)-1]
					delete(pos, o.r.id)
				}
			}
		}
		require.LessOrEqual(t, len(appendPayload(nil, ops)), maxPayload)
		f.frames = append(f.frames, ops)
	}
	b := header{minor: versionMinor, flags: formatFlags, gen: gen, baseSeq: 1}.append(nil)
	for i, ops := range f.frames {
		f.offs = append(f.offs, len(b))
		b = appendFrame(b, gen, uint64(i+1), appendPayload(nil, ops))
	}
	f.offs = append(f.offs, len(b))
	f.data = b
	require.Greater(t, len(b), 2*windowSize, "the file must span several windows")
	return f
}

// requireModel checks that s holds exactly the records of m: every id the
// file ever named is looked up, the count matches, and Unfinished lists
// exactly m's pending and unknown records with their content.
func requireModel(t *testing.T, s *Journal, f *craftedFile, m refModel, msg string) {
	t.Helper()
	requireModelBeside(t, s, f, m, false, msg)
}

// requireModelBeside is requireModel of a salvaged journal when salvaged is
// true: Unfinished may name actions of the damaged frame in a
// *journal.CorruptRecordsError, and lists the others of m's pending and
// unknown records.
func requireModelBeside(t *testing.T, s *Journal, f *craftedFile, m refModel, salvaged bool, msg string) {
	t.Helper()
	require.Equal(t, len(m), s.stats().Records, "%s: records", msg)
	for _, id := range f.ids {
		got, ok, err := s.get(id)
		require.NoError(t, err)
		want, in := m[id]
		require.Equal(t, in, ok, "%s: presence of %.20s", msg, id)
		if in {
			require.Equal(t, want.record(id), got, "%s: record %.20s", msg, id)
		}
	}
	u, err := s.Unfinished(context.Background())
	var named []string
	var ce *journal.CorruptRecordsError
	if salvaged && errors.As(err, &ce) {
		named, err = ce.IDs, nil
	}
	require.NoError(t, err)
	var wantU []journal.Record
	for id, r := range m {
		if r.state != journal.StateDone && !slices.Contains(named, id) {
			wantU = append(wantU, r.record(id))
		}
	}
	require.Len(t, u, len(wantU), msg)
	slices.SortFunc(wantU, func(a, b journal.Record) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ActionID, b.ActionID)
	})
	require.Equal(t, wantU, u, msg)
}

// recoveryOpts is the default config without compaction at Open, so that a
// test sees the file as recovery left it.
func recoveryOpts() config {
	o := testOpts()
	o.compactMin = 1 << 40
	return o
}

// frameTrace is what a scan applied, each payload by its digest.
type frameTrace struct {
	res    scanResult
	err    string
	frames []string
}

func traceDigest(src *source, salvage bool) frameTrace {
	var tr frameTrace
	res, err := scanSource(src, "j", salvage, func(seq uint64, p []byte) error {
		tr.frames = append(tr.frames, fmt.Sprintf("%d:%x", seq, sha256.Sum256(p)))
		return nil
	})
	tr.res, tr.err = res, fmt.Sprint(err)
	return tr
}

// cutsNear returns the offsets within d of each frame boundary and of each
// multiple of the window's size, in the file.
func cutsNear(f *craftedFile, d int) []int {
	seen := map[int]bool{}
	var cuts []int
	add := func(c int) {
		if c > 0 && c < len(f.data) && !seen[c] {
			seen[c] = true
			cuts = append(cuts, c)
		}
	}
	for _, b := range f.offs {
		for k := -d; k <= d; k++ {
			add(b + k)
		}
	}
	for w := windowSize; w < len(f.data); w += windowSize {
		for k := -d; k <= d; k++ {
			add(w + k)
		}
	}
	slices.Sort(cuts)
	return cuts
}

// Scanning the real file through Open's window decides what scanning it in
// memory decides, for the file cut near every frame boundary and window
// edge, and for a bit flipped near each.
func TestOpenWindowedScanMatchesMemory(t *testing.T) {
	t.Parallel()
	f := craftFile(t, 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "j")
	check := func(data []byte, msg string, salvages ...bool) {
		require.NoError(t, os.WriteFile(path, data, 0o600))
		fh, err := os.Open(path)
		require.NoError(t, err)
		defer fh.Close()
		for _, salvage := range salvages {
			src, err := openSource(fh)
			require.NoError(t, err)
			require.Equal(t, windowSize, src.win)
			got := traceDigest(src, salvage)
			want := traceDigest(memSource(data), salvage)
			require.Equal(t, want, got, "%s salvage=%v", msg, salvage)
		}
	}
	for _, c := range cutsNear(f, 2) {
		check(f.data[:c], fmt.Sprintf("cut %d", c), false)
	}
	for _, c := range cutsNear(f, 1) {
		if c < len(f.data)-1 {
			check(flipBit(f.data, c, uint(c%8)), fmt.Sprintf("flip %d", c), false, true)
		}
	}
}

// A crash can cut the file anywhere: Open, reading through its window,
// keeps exactly the records of the frames wholly before the cut, reports
// the rest as a torn tail, and the journal goes on.
func TestOpenTruncateNearWindowEdges(t *testing.T) {
	t.Parallel()
	f := craftFile(t, 2)
	cuts := cutsNear(f, 1)
	rng := rand.New(rand.NewPCG(3, 3))
	for range 10 {
		cuts = append(cuts, headerSize+rng.IntN(len(f.data)-headerSize))
	}
	cuts = append(cuts, len(f.data))
	models := map[int]refModel{}
	for n := 0; n <= len(f.frames); n++ {
		models[n] = f.model(func(i int) bool { return i < n })
	}
	for _, cut := range cuts {
		if cut < headerSize {
			continue
		}
		whole := 0
		for whole < len(f.frames) && f.offs[whole+1] <= cut {
			whole++
		}
		dir := writeJournal(t, f.data[:cut])
		s, rep, err := openWith(dir, recoveryOpts())
		require.NoError(t, err, "cut %d", cut)
		msg := fmt.Sprintf("cut %d (frames %d)", cut, whole)
		require.Equal(t, cut != f.offs[whole], rep.TornTail, msg)
		if rep.TornTail {
			require.Equal(t, int64(f.offs[whole]), rep.TornOffset, msg)
			require.Equal(t, int64(cut-f.offs[whole]), rep.TornBytes, msg)
		}
		requireModel(t, s, f, models[whole], msg)
		if cut%3 == 0 {
			// The journal goes on after the cut, and a reopen (with
			// compaction allowed) finds the same records and the new one.
			e := reserve(t, s, entry("after"))
			require.NoError(t, s.Close())
			s, rep, err = openWith(dir, testOpts())
			require.NoError(t, err, msg)
			require.False(t, rep.TornTail, msg)
			got, ok, err := s.get("after")
			require.NoError(t, err)
			require.True(t, ok, msg)
			require.Equal(t, e.Key, got.Key, msg)
			m := maps2(models[whole])
			require.Equal(t, len(m)+1, s.stats().Records, msg)
			for id, r := range m {
				got, ok, _ := s.get(id)
				require.True(t, ok, msg)
				require.Equal(t, r.record(id), got, msg)
			}
		}
		require.NoError(t, s.Close())
	}
}

func maps2(m refModel) refModel {
	c := refModel{}
	for k, v := range m {
		c[k] = v
	}
	return c
}

// A bit flipped in a frame that later frames follow is corruption of
// acknowledged data, wherever the frame lies against the window: Open fails
// with the frame's offset and sequence and changes nothing; salvage drops
// that frame alone (and copies the file aside), and the salvaged journal
// then opens as it is. A flip in the last frame is a torn tail.
func TestOpenBitFlipNearWindowEdges(t *testing.T) {
	t.Parallel()
	f := craftFile(t, 4)
	var targets []int // frames to damage: those around each window edge
	for w := windowSize; w < len(f.data); w += windowSize {
		for i := range f.frames {
			if f.offs[i] <= w && w < f.offs[i+1] || (f.offs[i] > w && f.offs[i] < w+frameHeaderSize+64) {
				targets = append(targets, i)
			}
		}
	}
	targets = append(targets, 1, len(f.frames)-1)
	last := len(f.frames) - 1
	for _, k := range targets {
		for _, where := range []string{"length", "seq", "payload-end", "window-edge"} {
			pos := 0
			switch where {
			case "length":
				pos = f.offs[k] + 4 + 2 // the third byte of the length
			case "seq":
				pos = f.offs[k] + 8
			case "payload-end":
				pos = f.offs[k+1] - 1
			case "window-edge":
				pos = -1
				for w := windowSize; w < len(f.data); w += windowSize {
					if f.offs[k] <= w && w < f.offs[k+1] {
						pos = w
					}
				}
				if pos < 0 {
					continue
				}
			}
			msg := fmt.Sprintf("frame %d %s byte %d", k, where, pos)
			damaged := flipBit(f.data, pos, 3)
			dir := writeJournal(t, damaged)
			s, rep, err := openWith(dir, recoveryOpts())
			if k == last {
				require.NoError(t, err, msg)
				require.True(t, rep.TornTail, msg)
				requireModel(t, s, f, f.model(func(i int) bool { return i < last }), msg)
				require.NoError(t, s.Close())
				continue
			}
			var ce *CorruptionError
			require.ErrorAs(t, err, &ce, msg)
			require.ErrorIs(t, err, ErrCorrupt, msg)
			require.Equal(t, int64(f.offs[k]), ce.Offset, msg)
			require.Equal(t, uint64(k+1), ce.FirstLostSeq, msg)
			require.Equal(t, uint64(k+1), ce.LastLostSeq, msg)
			on, err := os.ReadFile(filepath.Join(dir, journalName))
			require.NoError(t, err)
			require.Equal(t, damaged, on, "%s: Open changed the damaged file", msg)

			o := recoveryOpts()
			o.salvage = true
			s, rep, err = openWith(dir, o)
			require.NoError(t, err, msg)
			require.Len(t, rep.Salvaged, 1, msg)
			require.NotEmpty(t, rep.CorruptCopy, msg)
			want := f.model(func(i int) bool { return i != k })
			requireModelBeside(t, s, f, want, true, msg)
			require.NoError(t, s.Close())
			s, rep, err = openWith(dir, recoveryOpts())
			require.NoError(t, err, msg)
			require.Empty(t, rep.Salvaged, msg)
			require.False(t, rep.TornTail, msg)
			requireModel(t, s, f, want, msg)
			require.NoError(t, s.Close())
		}
	}
}

// An exact copy of a whole-window frame, written again right after it or
// after later frames, is skipped; the records are those of the file
// without it, and the reopened journal (rewritten without it) holds them.
func TestOpenDuplicatedLargeFrame(t *testing.T) {
	t.Parallel()
	f := craftFile(t, 5)
	var big []int
	for i := range f.frames {
		if f.offs[i+1]-f.offs[i] > maxPayload/2 {
			big = append(big, i)
		}
	}
	require.NotEmpty(t, big)
	want := f.model(func(int) bool { return true })
	for _, k := range big[:1] {
		copyK := f.data[f.offs[k]:f.offs[k+1]]
		for _, at := range []int{k + 1, min(k+3, len(f.frames)-1)} {
			data := slices.Concat(f.data[:f.offs[at]], copyK, f.data[f.offs[at]:])
			dir := writeJournal(t, data)
			s, rep, err := openWith(dir, testOpts())
			msg := fmt.Sprintf("copy of frame %d at %d", k, at)
			require.NoError(t, err, msg)
			require.Equal(t, 1, rep.Duplicates, msg)
			requireModel(t, s, f, want, msg)
			require.NoError(t, s.Close())
			s, rep, err = openWith(dir, testOpts())
			require.NoError(t, err, msg)
			require.Zero(t, rep.Duplicates, msg)
			requireModel(t, s, f, want, msg)
			require.NoError(t, s.Close())
		}
	}
}

// A compaction's journal.tmp of a journal spanning several windows is
// adopted when its rename was lost (journal missing, or journal.tmp past
// journal's last frame), with the batches appended to it afterwards, torn
// tail cut; a stale one is removed.
func TestOpenLargeTempAdoption(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	o := recoveryOpts()
	s, _ := mustOpen(t, dir, o)
	var es []journal.Record
	for i := range 4000 {
		e := entry(craftedID("t", i))
		if i%5 == 0 {
			e.Key = fmt.Sprintf("ck-%d", i)
		}
		es = append(es, e)
	}
	// Concurrent creators make large batches.
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(es); i += 8 {
				reserve(t, s, es[i])
			}
		}()
	}
	wg.Wait()
	for i := 0; i < len(es); i += 4 {
		require.NoError(t, s.Forget(context.Background(), es[i].ActionID))
	}
	old, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	require.NoError(t, s.Compact(context.Background()))
	after := entry(craftedID("after", 0))
	reserve(t, s, after)
	require.NoError(t, s.Close())
	snap, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	require.Greater(t, len(snap), 2*windowSize)

	check := func(s *Journal, msg string) {
		t.Helper()
		for i, e := range es {
			got, ok, err := s.get(e.ActionID)
			require.NoError(t, err)
			require.Equal(t, i%4 != 0, ok, "%s: %d", msg, i)
			if ok {
				require.Equal(t, e.Key, got.Key, msg)
			}
		}
		_, ok, _ := s.get(after.ActionID)
		require.True(t, ok, msg)
	}
	for _, c := range []struct {
		msg          string
		journal, tmp []byte // the files' contents; a nil journal: none
		adopted      bool   // journal.tmp adopted
		torn         bool
	}{
		// The rename lost, journal gone: journal.tmp (with the append after
		// the snapshot, and a torn tail) is adopted.
		{"adopted, journal missing", nil, append(slices.Clone(snap), 1, 2, 3), true, true},
		// The rename lost, the old journal still there: journal.tmp starts
		// past its last frame, and wins.
		{"adopted over the old journal", old, snap, true, false},
		// A journal.tmp that journal went on past is stale: removed.
		{"stale tmp removed", snap, old, false, false},
	} {
		d := t.TempDir()
		if c.journal != nil {
			require.NoError(t, os.WriteFile(filepath.Join(d, journalName), c.journal, 0o600))
		}
		require.NoError(t, os.WriteFile(filepath.Join(d, tmpName), c.tmp, 0o600))
		s, rep, err := openWith(d, recoveryOpts())
		require.NoError(t, err, c.msg)
		require.Equal(t, c.adopted, rep.AdoptedTemp, c.msg)
		require.Equal(t, !c.adopted, rep.RemovedTemp, c.msg)
		require.Equal(t, c.torn, rep.TornTail, c.msg)
		check(s, c.msg)
		require.NoError(t, s.Close())
		_, err = os.Stat(filepath.Join(d, tmpName))
		require.ErrorIs(t, err, os.ErrNotExist, c.msg)
	}
}

// The slab's refs are reused as records go (Forget, replacement, expiry at
// Open, in Reserve and in compaction): a record must never show another's
// content. A random history of max-length ids (and custom keys) runs
// against a model, on a fake clock, with compactions and reopens; after
// each step that reuses refs, every record is compared with the model.
func TestSlabReuseMatchesModel(t *testing.T) {
	t.Parallel()
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) { slabReuse(t, hashed) })
	}
}

func slabReuse(t *testing.T, hashed bool) {
	o, clk, t0 := hourClock()
	o.hashed = hashed
	o.compactMin = 64 << 10
	now := t0
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, o)
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, uint64(len(fmt.Sprint(hashed)))))
	model := map[string]journal.Record{} // by action id, as Reserve returns it
	var ids []string
	ret := o.retention
	expired := func(r journal.Record) bool {
		return r.State == journal.StateDone && now.Sub(r.CreatedAt) > ret
	}
	// An id as Unfinished reports it.
	reported := func(id string) string {
		if hashed {
			return journal.Digest(id)
		}
		return id
	}
	verify := func(step string) {
		t.Helper()
		for _, id := range ids {
			want, in := model[id]
			if in && expired(want) {
				in = false
			}
			got, ok, err := s.get(s.storedID(id))
			require.NoError(t, err)
			require.Equal(t, in, ok, "%s: presence of %.12s", step, id)
			if in {
				want.ActionID = s.storedID(id)
				require.Equal(t, want, got, "%s: %.12s", step, id)
			}
		}
		u, err := s.Unfinished(ctx)
		require.NoError(t, err)
		var wantU []string
		for id, r := range model {
			if r.State != journal.StateDone {
				wantU = append(wantU, reported(id))
			}
		}
		var gotU []string
		for _, r := range u {
			gotU = append(gotU, r.ActionID)
			orig := r.ActionID
			if hashed {
				for id := range model {
					if journal.Digest(id) == orig {
						orig = id
					}
				}
			}
			want := model[orig]
			want.ActionID = r.ActionID
			require.Equal(t, want, r, "%s: unfinished %.12s", step, orig)
		}
		slices.Sort(gotU)
		slices.Sort(wantU)
		require.Equal(t, wantU, gotU, step)
	}
	for step := range 1500 {
		switch k := rng.IntN(20); {
		case k < 8 || len(ids) < 5: // reserve, new or existing
			var id string
			if len(ids) > 0 && rng.IntN(3) == 0 {
				id = ids[rng.IntN(len(ids))]
			} else {
				id = craftedID("s", len(ids))
				ids = append(ids, id)
			}
			e := entry(id)
			e.CreatedAt = time.UnixMilli(now.UnixMilli())
			if rng.IntN(4) == 0 {
				e.Key = fmt.Sprintf("custom-%d", step)
			}
			if rng.IntN(3) == 0 {
				e.State, e.Status = journal.StateDone, 201
			}
			got, created, err := s.Reserve(ctx, e, journal.ReuseAny)
			require.NoError(t, err)
			old, had := model[id]
			if had && !expired(old) {
				require.False(t, created, "step %d", step)
				require.Equal(t, old, got, "step %d: the existing record", step)
			} else {
				require.True(t, created, "step %d", step)
				model[id] = got
			}
		case k < 12: // update
			if len(model) == 0 {
				continue
			}
			id := ids[rng.IntN(len(ids))]
			r, in := model[id]
			if !in || expired(r) {
				continue
			}
			u := r
			u.State = journal.State(1 + rng.IntN(3))
			u.Attempts = rng.IntN(9)
			u.Status = 200 + rng.IntN(300)
			if hashed && rng.IntN(2) == 0 {
				u.ActionID = journal.Digest(id)
			}
			require.NoError(t, s.Update(ctx, u), "step %d", step)
			if r.State != journal.StateDone {
				r.State, r.Status = u.State, u.Status
			}
			r.Attempts = max(r.Attempts, u.Attempts)
			model[id] = r
		case k < 15: // forget (by the digest form too)
			id := ids[rng.IntN(len(ids))]
			arg := id
			if hashed && rng.IntN(2) == 0 {
				arg = journal.Digest(id)
			}
			require.NoError(t, s.Forget(ctx, arg))
			delete(model, id)
		case k < 17: // time passes while open
			d := time.Minute
			if rng.IntN(4) == 0 {
				d = ret + time.Minute
			}
			now = now.Add(d)
			clk.Set(now)
			for id, r := range model {
				if expired(r) {
					delete(model, id) // gone for good: a Reserve creates anew
				}
			}
		case k == 17:
			require.NoError(t, s.Compact(ctx))
		default: // close and reopen
			require.NoError(t, s.Close())
			s, _ = mustOpen(t, dir, o)
		}
		if step%50 == 0 {
			verify(fmt.Sprintf("step %d", step))
		}
	}
	verify("end")
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, o)
	verify("reopened")
}

// Many goroutines create, update and forget records with max-length ids
// while others list Unfinished and compact: under -race the index is only
// touched under the journal's lock, and after a reopen every goroutine's
// acknowledged history holds.
func TestOpenAfterConcurrentChurn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	o := testOpts()
	o.compactMin = 32 << 10
	s, _ := mustOpen(t, dir, o)
	ctx := context.Background()
	const workers, per = 6, 120
	models := make([]map[string]journal.Record, workers)
	var wg sync.WaitGroup
	stop := inBackground(func() {
		_, err := s.Unfinished(ctx)
		assert.NoError(t, err)
		assert.NoError(t, s.Compact(ctx))
	})
	for w := range workers {
		models[w] = map[string]journal.Record{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range per {
				id := craftedID(fmt.Sprint("w", w), i)
				e := entry(id)
				if i%4 == 0 {
					e.Key = fmt.Sprintf("k-%d-%d", w, i)
				}
				got, created, err := s.Reserve(ctx, e, journal.ReuseAny)
				if !assert.NoError(t, err) || !assert.True(t, created) {
					return
				}
				got.Attempts, got.State, got.Status = 2, journal.StateDone, 200
				assert.NoError(t, s.Update(ctx, got))
				models[w][id] = got
				if rng.IntN(3) == 0 {
					victim := craftedID(fmt.Sprint("w", w), rng.IntN(i+1))
					assert.NoError(t, s.Forget(ctx, victim))
					delete(models[w], victim)
				}
			}
		}()
	}
	wg.Wait()
	stop()
	require.NoError(t, s.Close())
	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	total := 0
	for w := range workers {
		for i := range per {
			id := craftedID(fmt.Sprint("w", w), i)
			want, in := models[w][id]
			got, ok, err := s.get(id)
			require.NoError(t, err)
			require.Equal(t, in, ok, id[:12])
			if in {
				total++
				require.Equal(t, want, got)
			}
		}
	}
	require.Equal(t, total, s.stats().Records)
}

// A journal.tmp whose rename was lost holds acknowledged batches after its
// snapshot's end record (see TestLostCreationRenameKeepsRecords and
// TestLostCompactionRenameKeepsAppends). Damage to one of those batches,
// with a later valid batch after it, is damage to acknowledged data: Open
// must report it as corruption and change nothing, as it does for the same
// file named journal, never remove journal.tmp (and start an empty journal,
// or go on with the old one without those batches): guarantee 8. With
// salvage, journal.tmp is adopted and the damaged frame alone is lost.
func TestOpenDamagedLostRenameTempIsCorruption(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ compaction, inSnapshot bool }{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("compaction=%v/damage-in-snapshot=%v", c.compaction, c.inSnapshot), func(t *testing.T) {
			damagedLostRename(t, c.compaction, c.inSnapshot)
		})
	}
}

// With inSnapshot, the damage is in the compaction's snapshot (its record
// "before"), before its end record: journal.tmp was synced whole before its
// rename, and batches were appended after that, so that is damage to
// acknowledged data too.
func damagedLostRename(t *testing.T, compaction, inSnapshot bool) {
	dir := t.TempDir()
	s, compact := openKeepingOldJournal(t, dir)
	before := reserve(t, s, entry("before"))
	var oldJournal []byte
	if compaction {
		oldJournal = compact()
	}
	var es []journal.Record
	for i := range 6 {
		es = append(es, reserve(t, s, entry(fmt.Sprintf("pay-%d", i))))
	}
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	offs := frameOffsets(t, data)
	// The snapshot's frames, then one frame per Reserve: damage the third
	// of the six Reserves' frames.
	k := len(offs) - 6 + 2
	if inSnapshot {
		k = 0 // the snapshot's records, then its end record's own frame
	}
	damaged := flipBit(data, offs[k]+frameHeaderSize+2, 1)

	img := t.TempDir()
	if compaction {
		require.NoError(t, os.WriteFile(filepath.Join(img, journalName), oldJournal, 0o600))
	}
	require.NoError(t, os.WriteFile(filepath.Join(img, tmpName), damaged, 0o600))
	_, rep, err := openWith(img, testOpts())
	var ce *CorruptionError
	require.ErrorAs(t, err, &ce, "opened with %+v", rep)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Equal(t, int64(offs[k]), ce.Offset)
	got, rerr := os.ReadFile(filepath.Join(img, tmpName))
	require.NoError(t, rerr)
	require.Equal(t, damaged, got, "journal.tmp changed")
	if compaction {
		got, rerr := os.ReadFile(filepath.Join(img, journalName))
		require.NoError(t, rerr)
		require.Equal(t, oldJournal, got, "journal changed")
	}

	so := testOpts()
	so.salvage = true
	s, rep, err = openWith(img, so)
	require.NoError(t, err)
	require.True(t, rep.AdoptedTemp)
	require.Len(t, rep.Salvaged, 1)
	_, found, _ := s.get(before.ActionID)
	require.Equal(t, !inSnapshot, found)
	for i, e := range es {
		_, found, _ := s.get(e.ActionID)
		require.Equal(t, i != 2 || inSnapshot, found, "record %d", i)
	}
	require.NoError(t, s.Close())
}

// Open drops the records whose retention is over, even when most of the
// index is fresh: its walk over the index is skipped only when no record
// it replayed can have expired (recoveredExpiredIDs), and the one old
// record here must be found among the fresh ones.
func TestOpenDropsAnExpiredRecordAmongFreshOnes(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s := openHolding(t, dir, o, doneAt("old", t0))
	clk.Set(t0.Add(30 * time.Minute))
	require.NoError(t, s.Close())

	s = openHolding(t, dir, o, doneAt("fresh1", clk.Now()), doneAt("fresh2", clk.Now()), entry("pending"))
	clk.Set(t0.Add(61 * time.Minute)) // seen to pass, written by Close
	require.NoError(t, s.Close())

	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	assert.Equal(t, 3, s.stats().Records, "Open kept the record whose retention is over, or dropped another")
	for _, id := range []string{"fresh1", "fresh2", "pending"} {
		_, ok, err := s.get(id)
		require.NoError(t, err)
		assert.True(t, ok, id)
	}
}

// Open with nothing old enough to expire keeps every record (the walk is
// skipped), and one whose retention ended on the clock but not in the time
// the journal has seen pass is kept too.
func TestOpenWithNothingExpiredKeepsEveryRecord(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	dir := t.TempDir()
	s := openHolding(t, dir, o, doneAt("a", t0), doneAt("b", t0), entry("c"))
	clk.Set(t0.Add(59 * time.Minute))
	require.NoError(t, s.Close())
	clk.Set(t0.Add(5 * time.Hour)) // the clock jumped while closed

	s, _ = mustOpen(t, dir, o)
	defer s.Close()
	assert.Equal(t, 3, s.stats().Records)
}

// longerAgo is now-t > d on the whole range of int64, where the
// subtraction itself would overflow.
func TestLongerAgo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		now, t, d int64
		want      bool
	}{
		{100, 0, 99, true},
		{100, 0, 100, false},
		{100, 100, 0, false},
		{100, 200, 0, false},
		{1_700_000_000_000, math.MinInt64, 3_600_000, true},
		{math.MaxInt64, math.MinInt64, math.MaxInt64, true},
		{math.MinInt64, math.MaxInt64, 0, false},
		{0, math.MaxInt64, 0, false},
	} {
		assert.Equal(t, c.want, longerAgo(c.now, c.t, c.d), "longerAgo(%d, %d, %d)", c.now, c.t, c.d)
	}
}

// A record whose creation time lies so far back that now minus it
// overflowed int64 (a CreatedAt that Reserve accepted before CheckRecord
// bounded it) made recoveredExpiredIDs' bound overflow too
// (now.wall-oldest.wall < 0), and Open then skipped the walk and kept
// every expired record, where expiredIDs (the code before 01c0bbb) dropped
// them: Recovery.Records counted the expired "old", and Open no longer
// compacted a journal past compactMin that held an expired record. The
// oldest creation time CheckRecord allows is the test now.
func TestOpenDropsExpiredBesideAnOverflowingCreation(t *testing.T) {
	t.Parallel()
	o, clk, t0 := hourClock()
	o.compactMin = 0
	dir := t.TempDir()
	ancient := doneAt("ancient", t0)
	ancient.CreatedAt = time.UnixMilli(journal.MinCreatedAtUnixMilli)
	s := openHolding(t, dir, o, doneAt("old", t0), ancient, entry("pending"))
	clk.Set(t0.Add(61 * time.Minute)) // seen to pass, written by Close
	require.NoError(t, s.Close())

	s, rep := mustOpen(t, dir, o)
	defer s.Close()
	// expiredIDs finds "old" and "ancient" expired: the shortcut must
	// not hide them.
	s.mu.Lock()
	want := len(s.expiredIDs())
	s.mu.Unlock()
	assert.Zero(t, want, "Open left an expired record in the index")
	assert.Equal(t, 1, rep.Records, "Recovery.Records counts an expired record Open should have dropped (old, or the ancient one)")
	assert.True(t, rep.Compacted, "Open did not compact away the expired record")
}

// insertCopy returns data with a copy of frame k inserted after frame at.
func insertCopy(data []byte, offs []int, k, at int) []byte {
	end := func(i int) int {
		if i+1 < len(offs) {
			return offs[i+1]
		}
		return len(data)
	}
	out := append([]byte(nil), data[:end(at)]...)
	out = append(out, data[offs[k]:end(k)]...)
	return append(out, data[end(at):]...)
}

// A duplicated frame (the same valid frame twice) is recognised as a copy of
// an applied one and skipped: no acknowledged frame after it is lost, and
// nothing is reported torn or corrupt while new frames follow it.
func TestDuplicatedFrame(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data) // frame 0: the empty snapshot; frame i: es[i-1]
	last := len(offs) - 1
	cases := []struct {
		name  string
		k, at int
		torn  bool
	}{
		{"first frame twice", 0, 0, false},
		{"middle frame twice", 2, 2, false},
		{"just before the last frame", last - 1, last - 1, false},
		{"last frame twice", last, last, true}, // a copy at the tail: cut, nothing lost
		{"older frame in the middle", 1, 3, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeJournal(t, insertCopy(data, offs, c.k, c.at))
			s, rep, err := openWith(dir, testOpts())
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, c.torn, rep.TornTail, "torn tail")
			assert.Equal(t, len(es), rep.Records)
			for _, e := range es {
				got, ok, _ := s.get(e.ActionID)
				require.True(t, ok, "%s lost", e.ActionID)
				assert.Equal(t, e.Key, got.Key)
			}
			if !c.torn {
				assert.Equal(t, 1, rep.Duplicates)
			}
			reserve(t, s, entry("after"))
			require.NoError(t, s.Close())
			s, _, err = openWith(dir, testOpts())
			require.NoError(t, err, "reopen after an append")
			_, ok, _ := s.get("after")
			assert.True(t, ok)
		})
	}
}

// The case seen in the field: the frame before a Forget duplicated; the
// Forget, the last frame, must not be cut as a torn tail.
func TestDuplicateBeforeForget(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	a := reserve(t, s, entry("a"))
	reserve(t, s, entry("b"))
	require.NoError(t, s.Forget(context.Background(), "a"))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	offs := frameOffsets(t, data)
	last := len(offs) - 1
	dir = writeJournal(t, insertCopy(data, offs, last-1, last-1))
	s, rep, err := openWith(dir, testOpts())
	require.NoError(t, err)
	defer s.Close()
	assert.False(t, rep.TornTail, "the Forget was reported torn")
	_, ok, _ := s.get("a")
	assert.False(t, ok, "forgotten action %s came back", a.Key)
}

// With salvage, a duplicate followed later by real damage loses the damaged
// frame only, never the frame after the duplicate.
func TestDuplicateThenDamageSalvage(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	d := insertCopy(data, offs, 2, 2) // frame 2 twice
	doffs := append(append([]int(nil), offs[:3]...), offs[3]-offs[2]+offs[3])
	for _, o := range offs[3:] {
		doffs = append(doffs, o+offs[3]-offs[2])
	}
	doffs = append(doffs[:3], doffs[4:]...) // frame starts after the copy
	d = flipBit(d, doffs[4]+20, 1)          // damage frame 4 (es[3])
	dir := writeJournal(t, d)
	_, _, err := openWith(dir, testOpts())
	var ce *CorruptionError
	require.True(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, int64(doffs[4]), ce.Offset)
	o := testOpts()
	o.salvage = true
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	defer s.Close()
	require.Len(t, rep.Salvaged, 1)
	for i, e := range es {
		_, ok, _ := s.get(e.ActionID)
		assert.Equal(t, i != 3, ok, "record %d (frame %d)", i, i+1)
	}
}

// Damage inserted before an intact frame loses nothing: it is reported as
// corruption (not cut with the frame after it), and salvage keeps the frame.
func TestGarbageBeforeIntactFrame(t *testing.T) {
	t.Parallel()
	data, es := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	last := len(offs) - 1
	for _, at := range []int{2, last - 1} {
		d := append([]byte(nil), data[:offs[at+1]]...)
		d = append(d, "some garbage!"...)
		d = append(d, data[offs[at+1]:]...)
		dir := writeJournal(t, d)
		_, _, err := openWith(dir, testOpts())
		var ce *CorruptionError
		require.True(t, errors.As(err, &ce), "garbage after frame %d: %v", at, err)
		assert.Equal(t, int64(offs[at+1]), ce.Offset)
		o := testOpts()
		o.salvage = true
		s, _, err := openWith(dir, o)
		require.NoError(t, err)
		for _, e := range es {
			_, ok, _ := s.get(e.ActionID)
			assert.True(t, ok, "garbage after frame %d: %s lost", at, e.ActionID)
		}
		require.NoError(t, s.Close())
	}
}

// asideFiles returns the names and sizes of the torn and corrupt copies,
// and of any other file but the journal's own, in dir.
func asideFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]int64{}
	for _, e := range ents {
		switch e.Name() {
		case journalName, lockName, secretName, "filler":
			continue
		}
		fi, err := e.Info()
		require.NoError(t, err)
		out[e.Name()] = fi.Size()
	}
	return out
}

// tornJournal returns a journal file of five records with a torn tail.
func tornJournal(t *testing.T) ([]byte, []journal.Record) {
	data, es := buildJournal(t, 5)
	return append(data, []byte(strings.Repeat("torn tail ", 30))...), es
}

// Issue 7, item 15, on a real full file system: opening a journal with a
// torn tail while the disk is full succeeds (the tail holds no acknowledged
// record, and is cut all the same), says why no copy was kept, leaves no
// empty or partial copy behind, and never prunes a real copy in favour of
// one; once there is room again, copies are made and pruned as before.
func TestTornTailOnFullDisk(t *testing.T) {
	t.Parallel()
	mnt := smallFS(t)
	dir := filepath.Join(mnt, "j")
	require.NoError(t, os.Mkdir(dir, 0o700))
	real := []string{tornPrefix + "20200101T000000.000000001", tornPrefix + "20200101T000000.000000002", tornPrefix + "20200101T000000.000000003"}
	for _, n := range real {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("a real torn tail"), 0o600))
	}
	data, es := tornJournal(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), data, 0o600))
	fill(t, dir)

	for range 3 { // an app retrying its start, a torn tail each time
		s, rep, err := openWith(dir, testOpts())
		require.NoError(t, err, "open on a full disk with a torn tail")
		assert.True(t, rep.TornTail)
		assert.Empty(t, rep.TornCopy)
		assert.ErrorIs(t, rep.TornCopyErr, syscall.ENOSPC)
		for _, e := range es {
			got, ok, _ := s.get(e.ActionID)
			require.True(t, ok)
			assert.Equal(t, e.Key, got.Key)
		}
		require.NoError(t, s.Close())
		files := asideFiles(t, dir)
		assert.Len(t, files, len(real), "copies: %v", files)
		for _, n := range real {
			assert.Equal(t, int64(len("a real torn tail")), files[n], "%s pruned or emptied", n)
		}
		cur, err := os.ReadFile(filepath.Join(dir, journalName))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), append(cur, "torn again"...), 0o600))
	}

	require.NoError(t, os.Remove(filepath.Join(dir, "filler")))
	s, rep, err := openWith(dir, testOpts())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NotEmpty(t, rep.TornCopy)
	files := asideFiles(t, dir)
	assert.Len(t, files, 3)
	assert.Equal(t, int64(len("torn again")), files[filepath.Base(rep.TornCopy)])
	assert.NotContains(t, files, real[0], "the oldest copy is the one pruned")
}

// The same through the file seam, on any system: a copy whose write fails
// leaves nothing behind.
func TestTornCopyWriteFails(t *testing.T) {
	t.Parallel()
	data, es := tornJournal(t)
	dir := writeJournal(t, data)
	var fail sync.Map
	fail.Store("short:"+asideTmpName, true)
	o := testOpts()
	o.hooks = faultyHooks(&fail)
	s, rep, err := openWith(dir, o)
	require.NoError(t, err)
	defer s.Close()
	assert.True(t, rep.TornTail)
	assert.Empty(t, rep.TornCopy)
	assert.ErrorIs(t, rep.TornCopyErr, errNoSpace)
	assert.Empty(t, asideFiles(t, dir))
	assert.Equal(t, len(es), rep.Records)
}

// Pruning keeps the newest copies, the new one included. (Until the module
// had a first release, empty copies that earlier versions could leave were
// pruned first; no version of this format leaves one.)
func TestPruneKeepsNewestCopies(t *testing.T) {
	t.Parallel()
	data, _ := tornJournal(t)
	dir := writeJournal(t, data)
	old := []string{tornPrefix + "20200101T000000.000000001", tornPrefix + "20200101T000000.000000002",
		tornPrefix + "20210101T000000.000000001", tornPrefix + "20210101T000000.000000002"}
	for _, n := range old {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("a torn tail"), 0o600))
	}
	s, rep, err := openWith(dir, testOpts())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	files := asideFiles(t, dir)
	assert.Len(t, files, 3, "%v", files)
	assert.Contains(t, files, filepath.Base(rep.TornCopy))
	for _, n := range old[2:] {
		assert.Contains(t, files, n, "a newer copy was pruned")
	}
}

// A salvage still refuses to go on without its copy of the damaged file:
// the copy is the only trace of acknowledged records it drops.
func TestSalvageCopyFailsOpen(t *testing.T) {
	t.Parallel()
	data, _ := buildJournal(t, 5)
	offs := frameOffsets(t, data)
	dir := writeJournal(t, flipBit(data, offs[3]+20, 3))
	var fail sync.Map
	fail.Store("short:"+asideTmpName, true)
	o := testOpts()
	o.salvage = true
	o.hooks = faultyHooks(&fail)
	_, _, err := openWith(dir, o)
	require.True(t, errors.Is(err, errNoSpace), "%v", err)
	assert.Empty(t, asideFiles(t, dir))
	_, _, err = openWith(dir, testOpts())
	assert.ErrorIs(t, err, ErrCorrupt, "the journal was changed")
}
