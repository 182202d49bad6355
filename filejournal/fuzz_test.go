package filejournal

import (
	"bytes"
	"context"
	"errors"
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
