package journal

import (
	"bytes"
	"testing"
)

// FuzzDecode is T1: whatever the bytes, scanning never panics, never
// allocates by a length it has not checked (MaxPayload caps it), accepts
// only a prefix of whole valid frames (and exact copies of them, skipped),
// and re-encoding what it accepted gives the same bytes.
func FuzzDecode(f *testing.F) {
	data, _ := buildJournal(f, 3)
	f.Add(data)
	f.Add(data[:len(data)-5])
	f.Add(data[:HeaderSize])
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
