package filejournal

// ref is where a record of the index is in Journal.slots. The index's map
// holds refs, not the records themselves: a Go map's tables are at most 7/8
// full, and about half full just after they double (all of them at about
// the same count, since keys spread evenly: a million records is such a
// count), so what the map leaves empty is its entry size times its
// capacity. With a 4-byte ref an entry is 24 bytes, with the 72-byte
// record 88: for a million records, 56 MB of map and 72 of records
// instead of 201 MB of map.
type ref uint32

// slab holds the records of the index, by ref, in chunks that never move
// (growing it copies nothing). The refs of removed records are reused.
type slab struct {
	chunks [][]slot
	free   []ref
	n      int // refs handed out
}

const slabChunk = 1024

func (s *slab) at(r ref) *slot { return &s.chunks[r/slabChunk][r%slabChunk] }

// alloc stores v and returns its ref.
func (s *slab) alloc(v slot) ref {
	var r ref
	if n := len(s.free); n > 0 {
		r, s.free = s.free[n-1], s.free[:n-1]
	} else {
		if s.n%slabChunk == 0 {
			s.chunks = append(s.chunks, make([]slot, slabChunk))
		}
		r = ref(s.n)
		s.n++
	}
	*s.at(r) = v
	return r
}

// release makes r free for reuse.
func (s *slab) release(r ref) {
	*s.at(r) = slot{}
	s.free = append(s.free, r)
}
