package filejournal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// FuzzDecode is T1: whatever the bytes, scanning never panics, never
// allocates by a length it has not checked (maxPayload caps it), accepts
// only a prefix of whole valid frames (and exact copies of them, skipped),
// and re-encoding what it accepted gives the same bytes.
func FuzzDecode(f *testing.F) {
	data, _ := buildJournal(f, 3)
	f.Add(data)
	f.Add(data[:len(data)-5])
	f.Add(data[:headerSize])
	f.Add(append(append([]byte(nil), data...), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, data []byte) {
		type frame struct {
			seq     uint64
			payload []byte
		}
		var frames []frame
		res, err := scan(data, "fuzz", true, func(seq uint64, p []byte) error {
			var re []op
			if err := decodePayload(p, func(o *op) error { re = append(re, *o); return nil }); err != nil {
				return err
			}
			if enc := appendPayload(nil, re); !bytes.Equal(enc, p) {
				t.Fatalf("payload re-encoding differs:\n%x\n%x", p, enc)
			}
			frames = append(frames, frame{seq, p})
			return nil
		})
		if err != nil {
			return
		}
		if res.end > len(data) {
			t.Fatalf("end %d beyond %d", res.end, len(data))
		}
		if len(res.salvaged) > 0 {
			return // frames after a skipped range are not a prefix
		}
		enc := res.hdr.append(nil)
		for _, fr := range frames {
			enc = appendFrame(enc, res.hdr.gen, fr.seq, fr.payload)
		}
		// Skipped copies of earlier frames are exact copies: without them,
		// the accepted bytes are the accepted frames.
		var kept []byte
		from := 0
		for _, d := range res.dups {
			if d.off < from || d.end > res.end {
				t.Fatalf("duplicate %v out of order or past the end %d", d, res.end)
			}
			kept = append(kept, data[from:d.off]...)
			from = d.end
		}
		kept = append(kept, data[from:res.end]...)
		if !bytes.Equal(enc, kept) {
			t.Fatalf("accepted frames re-encode differently")
		}
	})
}

// noSyncFile is a journal file whose Sync does nothing: durability is not
// what FuzzActionID checks, and an fsync per input would leave the fuzzer a
// few inputs a second.
type noSyncFile struct{ file }

func (noSyncFile) Sync() error { return nil }

// FuzzActionID: every action id that journal.CheckRecord accepts goes into
// the file journal and reads back byte for byte, plain and with hashed ids
// (from Reserve as given; from Unfinished as given, or in digest form);
// every id it refuses is refused with journal.ErrInvalidRecord, and nothing
// is stored. (Together with the root package's FuzzCheckActionID: every id
// the Transport accepts is stored as it is.)
func FuzzActionID(f *testing.F) {
	for _, s := range []string{
		"pay:order-A-1001", "", "\x00", "é", "\xff\xfe", "a b\n",
		strings.Repeat("a", journal.MaxActionID), strings.Repeat("a", journal.MaxActionID+1),
		journal.Digest("pay:1"), strings.ToUpper(journal.Digest("pay:1")),
	} {
		f.Add(s)
	}
	noSync := withHooks(&hooks{wrapFile: func(_ string, f file) file { return noSyncFile{f} }})
	var js []*Journal
	for _, hashed := range []Option{nil, WithHashedIDs()} {
		j, err := Open(f.TempDir(), noSync, hashed)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { j.Close() })
		js = append(js, j)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, id string) {
		rec := journal.Record{ActionID: id, Key: newKey(), CreatedAt: time.Now(), State: journal.StatePending}
		valid := journal.CheckRecord(rec) == nil
		for _, j := range js {
			got, created, err := j.Reserve(ctx, rec, journal.ReuseAny)
			if !valid {
				if !errors.Is(err, journal.ErrInvalidRecord) {
					t.Fatalf("Reserve(%q) of an id CheckRecord refuses: %v", id, err)
				}
				if un, err := j.Unfinished(ctx); err != nil || len(un) != 0 {
					t.Fatalf("refused id %q stored: %v, %v", id, un, err)
				}
				continue
			}
			if err != nil || !created || got.Key != rec.Key || got.ActionID != id {
				t.Fatalf("Reserve(%q) (hashed %v): %+v, created %v, %v", id, j.opts.hashed, got, created, err)
			}
			other := rec
			other.Key = newKey()
			again, created, err := j.Reserve(ctx, other, journal.ReuseAny)
			if err != nil || created || again.Key != rec.Key || again.ActionID != id {
				t.Fatalf("Reserve(%q) again (hashed %v): %+v, created %v, %v", id, j.opts.hashed, again, created, err)
			}
			want := id
			if j.opts.hashed {
				want = journal.Digest(id)
			}
			un, err := j.Unfinished(ctx)
			if err != nil || len(un) != 1 || un[0].ActionID != want || un[0].Key != rec.Key {
				t.Fatalf("Unfinished after Reserve(%q) (hashed %v): %+v, %v; want id %q", id, j.opts.hashed, un, err, want)
			}
			if err := j.Forget(ctx, un[0].ActionID); err != nil {
				t.Fatal(err)
			}
			if un, err := j.Unfinished(ctx); err != nil || len(un) != 0 {
				t.Fatalf("Forget(%q) left %+v, %v", un[0].ActionID, un, err)
			}
		}
	})
}

// damageFixture is a journal built from random operations, one synced frame
// each, with the state the journal must show after each whole frame.
type damageFixture struct {
	data   []byte
	offs   []int               // frame starts
	states []map[string]string // id -> key after frame i
}

func buildDamageFixture(t testing.TB, seed uint64) damageFixture {
	rng := rand.New(rand.NewPCG(seed, 7))
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	ctx := context.Background()
	// model: id -> "key state"; states: the model after each frame.
	model := map[string]string{}
	keys := map[string]string{} // id -> its last key, forgotten ones too
	var states []map[string]string
	step := func() { // a frame was written and synced
		m := make(map[string]string, len(model))
		for k, v := range model {
			m[k] = v
		}
		states = append(states, m)
	}
	step() // the empty snapshot's end frame
	var ids []string
	live := func(want string) (string, bool) { // a random live id in state want ("" any)
		id := ids[rng.IntN(len(ids))]
		v, ok := model[id]
		return id, ok && (want == "" || v == keys[id]+" "+want)
	}
	create := func(e journal.Record, mode journal.ReserveMode) {
		if _, created, err := s.Reserve(ctx, e, mode); err != nil || !created {
			t.Fatalf("reserve %s: created %v, %v", e.ActionID, created, err)
		}
		model[e.ActionID], keys[e.ActionID] = e.Key+" pending", e.Key
		step()
	}
	// A new record of an action with the key of its earlier record (a
	// caller's key used again): replay must not take it for an update of
	// the earlier one (done is final).
	again := func(id string) journal.Record {
		e := entry(id)
		e.Key = keys[id]
		e.Fingerprint[0] ^= 0xff
		return e
	}
	for i := range 4 + rng.IntN(8) {
		switch k := rng.IntN(12); {
		case k < 6 || len(ids) == 0:
			e := entry(fmt.Sprintf("a%d", i))
			if rng.IntN(4) == 0 {
				e.Key = fmt.Sprintf("custom-%d", rng.Uint32())
			}
			create(e, journal.ReuseAny)
			ids = append(ids, e.ActionID)
		case k < 8:
			id, ok := live("")
			if !ok {
				continue
			}
			if err := update(s, id, keys[id], journal.StateDone, uint32(i), 200); err != nil {
				t.Fatal(err)
			}
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			model[id] = keys[id] + " done"
			step()
		case k < 10:
			id, ok := live("")
			if !ok {
				continue
			}
			if err := s.Forget(ctx, id); err != nil {
				t.Fatal(err)
			}
			delete(model, id)
			step()
		case k == 10: // a done record replaced under its own key
			if id, ok := live("done"); ok {
				create(again(id), journal.ReusePending)
			}
		default: // forgotten, then created again under its old key
			id := ids[rng.IntN(len(ids))]
			if _, ok := model[id]; ok {
				if err := s.Forget(ctx, id); err != nil {
					t.Fatal(err)
				}
				delete(model, id)
				step()
			}
			create(again(id), journal.ReuseAny)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	offs := frameOffsets(t, data)
	if len(offs) != len(states) {
		t.Fatalf("%d frames for %d states", len(offs), len(states))
	}
	return damageFixture{data: data, offs: offs, states: states}
}

// end returns where frame k ends.
func (f *damageFixture) end(k int) int {
	if k+1 < len(f.offs) {
		return f.offs[k+1]
	}
	return len(f.data)
}

// frameOf returns the index of the frame holding byte off (-1: header).
func (f *damageFixture) frameOf(off int) int {
	i := -1
	for k, o := range f.offs {
		if o <= off {
			i = k
		}
	}
	return i
}

// FuzzDamage is T2: damage a journal built from random operations
// (truncate, flip, zero a range, append garbage, append a copy of an old
// frame, insert a copy of a frame after it or a later one), recover, and
// check the oracle and the classification: damage confined to the last
// frame or after it is a torn tail and loses only that frame; damage to an
// earlier frame is refused as corruption, naming the damaged frame; a
// duplicated frame loses nothing; nothing else is ever lost or invented.
func FuzzDamage(f *testing.F) {
	for i := range 12 {
		f.Add(uint64(i), uint8(i%6), uint32(i*37), uint8(i*11))
	}
	fixtures := map[uint64]damageFixture{}
	f.Fuzz(func(t *testing.T, seed uint64, kind uint8, pos uint32, val uint8) {
		seed %= 4 // a few fixtures, built once: building is the slow part
		fx, ok := fixtures[seed]
		if !ok {
			fx = buildDamageFixture(t, seed)
			fixtures[seed] = fx
		}
		data := append([]byte(nil), fx.data...)
		body := len(data) - headerSize
		p := headerSize + int(pos)%body
		last := len(fx.offs) - 1
		wantFrames := last // index of the last frame that must survive
		corruptAt := -1    // frame offset a corruption error must name
		switch kind % 6 {
		case 0: // truncate
			data = data[:p]
			wantFrames = -1 // the last frame that ends at or before the cut
			for k := range fx.offs {
				if fx.end(k) <= p {
					wantFrames = k
				}
			}
		case 1, 2: // flip bits, or zero a range
			if kind%6 == 1 {
				data[p] ^= max(val, 1)
			} else {
				for i := p; i < min(len(data), p+1+int(val)); i++ {
					data[i] = 0
				}
				if string(data) == string(fx.data) {
					return // zeroed bytes that were zero
				}
			}
			// The range of bytes that really changed (a zeroed byte may
			// have been zero).
			from, damagedTo := -1, -1
			for i := range data {
				if data[i] != fx.data[i] {
					if from < 0 {
						from = i
					}
					damagedTo = i
				}
			}
			k := fx.frameOf(from)
			if fx.frameOf(damagedTo) == last {
				wantFrames = k - 1 // nothing valid after the damage: torn
			} else {
				corruptAt = fx.offs[k]
			}
		case 3: // append garbage
			for i := 0; i <= int(val); i++ {
				data = append(data, byte(i*31)^byte(pos))
			}
		case 4: // append a copy of an older frame
			k := int(pos) % len(fx.offs)
			data = append(data, fx.data[fx.offs[k]:fx.end(k)]...)
		case 5: // a frame written twice: a copy of frame k after frame m >= k
			k := int(pos) % len(fx.offs)
			m := k + int(val)%(len(fx.offs)-k)
			data = append(append(append([]byte(nil), fx.data[:fx.end(m)]...),
				fx.data[fx.offs[k]:fx.end(k)]...), fx.data[fx.end(m):]...)
		}
		dir := writeJournal(t, data)
		s, _, err := openWith(dir, testOpts())
		if corruptAt >= 0 {
			var ce *CorruptionError
			if !errors.As(err, &ce) {
				t.Fatalf("kind %d val %d: damage at %d (frame at %d, frames %v, len %d): want corruption, got %v", kind%6, val, p, corruptAt, fx.offs, len(fx.data), err)
			}
			if ce.Offset != int64(corruptAt) {
				t.Fatalf("kind %d val %d at %d: corruption named offset %d, want %d (frames %v): %v", kind%6, val, p, ce.Offset, corruptAt, fx.offs, ce)
			}
			return
		}
		if err != nil {
			t.Fatalf("kind %d at %d: %v", kind%6, p, err)
		}
		defer s.Close()
		want := fx.states[max(wantFrames, 0)]
		st := s.stats()
		if st.Records != len(want) {
			t.Fatalf("kind %d at %d: %d records, want %d (frames up to %d)", kind%6, p, st.Records, len(want), wantFrames)
		}
		for id, v := range want {
			got, ok, _ := s.get(id)
			if !ok || got.Key+" "+got.State.String() != v {
				t.Fatalf("kind %d at %d: %s lost or changed: %v %+v, want %s", kind%6, p, id, ok, got, v)
			}
		}
	})
}
