package filejournal

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Adversarial tests of the windowed recovery (source, countLive, replay into
// the slab): journals larger than several windows, frames of the largest
// payload straddling the window's edges, ids of journal.MaxActionID bytes.

// reviewID returns an id of exactly journal.MaxActionID bytes whose every
// part depends on tag and i (so ids sharing a prefix still differ late).
func reviewID(tag string, i int) string {
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

// reviewFile is a crafted journal file and the operations of its frames.
type reviewFile struct {
	data   []byte
	frames [][]op // frame i has sequence i+1
	offs   []int  // start of frame i; offs[len(frames)] is the file's end
	ids    []string
}

// model returns the records of replaying the frames for which keep is true.
func (f *reviewFile) model(keep func(i int) bool) refModel {
	m := refModel{}
	for i, fr := range f.frames {
		if keep(i) {
			m.apply(fr)
		}
	}
	return m
}

// craftReviewFile writes a journal of frames of every size, several of the
// largest payload, whose records have ids of journal.MaxActionID bytes:
// creations (a delete then an upsert, as Reserve writes them), updates with
// the same key (stale ones after done among them), replacements under
// another key, custom keys, forgets, creations again after a forget.
func craftReviewFile(t testing.TB, seed uint64) *reviewFile {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	const gen = 0xfeed1234
	f := &reviewFile{}
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
				id := reviewID(fmt.Sprint("c", seed), nextID)
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
	b := header{minor: versionMinor, flags: flagSeen, gen: gen, baseSeq: 1}.append(nil)
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
func requireModel(t *testing.T, s *Journal, f *reviewFile, m refModel, msg string) {
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
	require.NoError(t, err)
	var wantU []journal.Record
	for id, r := range m {
		if r.state != journal.StateDone {
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

// reviewOpts is the default config without compaction at Open, so that a
// test sees the file as recovery left it.
func reviewOpts() config {
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
func cutsNear(f *reviewFile, d int) []int {
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
func TestReviewWindowedScanMatchesMemory(t *testing.T) {
	f := craftReviewFile(t, 1)
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
func TestReviewTruncateNearWindowEdges(t *testing.T) {
	f := craftReviewFile(t, 2)
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
		s, rep, err := openWith(dir, reviewOpts())
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
func TestReviewBitFlipNearWindowEdges(t *testing.T) {
	f := craftReviewFile(t, 4)
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
			s, rep, err := openWith(dir, reviewOpts())
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

			o := reviewOpts()
			o.salvage = true
			s, rep, err = openWith(dir, o)
			require.NoError(t, err, msg)
			require.Len(t, rep.Salvaged, 1, msg)
			require.NotEmpty(t, rep.CorruptCopy, msg)
			want := f.model(func(i int) bool { return i != k })
			requireModel(t, s, f, want, msg)
			require.NoError(t, s.Close())
			s, rep, err = openWith(dir, reviewOpts())
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
func TestReviewDuplicatedLargeFrame(t *testing.T) {
	f := craftReviewFile(t, 5)
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
func TestReviewLargeTempAdoption(t *testing.T) {
	dir := t.TempDir()
	o := reviewOpts()
	s, _ := mustOpen(t, dir, o)
	var es []journal.Record
	for i := range 4000 {
		e := entry(reviewID("t", i))
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
	after := entry(reviewID("after", 0))
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
		s, rep, err := openWith(d, reviewOpts())
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
func TestReviewSlabReuseMatchesModel(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) { reviewSlabReuse(t, hashed) })
	}
}

func reviewSlabReuse(t *testing.T, hashed bool) {
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
				id = reviewID("s", len(ids))
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
func TestReviewConcurrentChurnThenReopen(t *testing.T) {
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
				id := reviewID(fmt.Sprint("w", w), i)
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
					victim := reviewID(fmt.Sprint("w", w), rng.IntN(i+1))
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
			id := reviewID(fmt.Sprint("w", w), i)
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
func TestReviewDamagedLostRenameTempIsCorruption(t *testing.T) {
	for _, c := range []struct{ compaction, inSnapshot bool }{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("compaction=%v/damage-in-snapshot=%v", c.compaction, c.inSnapshot), func(t *testing.T) {
			reviewDamagedLostRename(t, c.compaction, c.inSnapshot)
		})
	}
}

// With inSnapshot, the damage is in the compaction's snapshot (its record
// "before"), before its end record: journal.tmp was synced whole before its
// rename, and batches were appended after that, so that is damage to
// acknowledged data too.
func reviewDamagedLostRename(t *testing.T, compaction, inSnapshot bool) {
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
