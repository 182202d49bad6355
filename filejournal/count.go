package filejournal

import "hash/maphash"

// countLive returns how many records replaying src would leave in the
// index, counted over its frames in sequence from the start up to the first
// that is not (a torn tail, damage, a copy), by hashes of their ids. It is
// the size recovery gives the index's map before replaying src: a Go map
// grown one insert at a time ends no smaller than one sized once, but
// allocates about half as much again on the way (the tables it outgrows)
// and spends as much time moving records. It is a hint only: an error, a
// hash collision or a frame it does not reach makes it low, and then the
// map grows as it would have. It reads src once more, which costs much
// less than the growth it saves (see liveCounter for how it counts).
func countLive(src *source) int {
	hb, err := src.bytes(0, headerSize)
	if err != nil {
		return 0
	}
	hdr, err := parseHeader(hb)
	if err != nil {
		return 0
	}
	// A first guess of the operations to come, from the file's size: about
	// one per 64 bytes, up to maxCountHint (the buckets grow past it as
	// records come): the size of a damaged or crafted file, a hole of
	// zeros, says nothing of its records, and must not allocate gigabytes
	// before one frame is read.
	c := newLiveCounter(min(src.size/64, maxCountHint))
	seed := maphash.MakeSeed()
	count := func(o *op, id []byte) error {
		switch o.kind {
		case opUpsert:
			c.add(maphash.Bytes(seed, id), true)
		case opDelete:
			c.add(maphash.Bytes(seed, id), false)
		}
		return nil
	}
	var o op
	next := hdr.baseSeq
	for off := headerSize; off < src.size; {
		seq, payload, end, ok, err := src.frame(off, hdr.gen)
		if err != nil || !ok || seq != next {
			break
		}
		if decodeOpsInto(payload, &o, count) != nil {
			break
		}
		off, next = end, next+1
	}
	return c.count()
}

// maxCountHint caps countLive's first guess: 4M operations, 16 MB of
// buckets (a journal of some 300 MB).
const maxCountHint = 4 << 20

// liveCounter counts the ids that a sequence of upserts and deletes leaves,
// by 64-bit hashes of the ids. One set of every hash, updated as the
// operations come, costs a cache miss per operation once it outgrows the
// CPU's caches (a million ids: 5 MB, 200 ns an operation here). Instead the
// operations are appended, in order, to one of liveBuckets buckets chosen
// by the hash's top bits, and each bucket is then replayed into a small
// hashSet, reused from bucket to bucket, which stays in the caches: a
// bucket holds every operation of its ids, in sequence, so an id deleted
// and then created again counts as it should. An entry is the hash's low 32
// bits (hashSet keeps 30 of them) with its low bit telling an upsert:
// two ids collide only if they share a bucket and those 30 bits, about
// twice among a million ids.
//
// A bucket holds the ids it leaves, not every operation of the file: when
// it is full, it is replayed and, if at most half of it is left, replaced by
// the ids left, as upserts (compact). Its memory is then at most twice its
// live ids or its share of the first guess, however many updates and
// deletes the file holds (a crafted one can be nothing else).
type liveCounter struct {
	buckets [liveBuckets][]uint32
	set     hashSet // replays a bucket (replay)
}

const (
	liveBucketBits = 8
	liveBuckets    = 1 << liveBucketBits
	// liveCompactMin is the least capacity of a bucket that is compacted
	// when full: a smaller one grows instead.
	liveCompactMin = 256
)

// newLiveCounter returns a liveCounter whose buckets have room for about
// hint operations in all.
func newLiveCounter(hint int) *liveCounter {
	c := new(liveCounter)
	if per := hint / liveBuckets; per > 0 {
		for i := range c.buckets {
			c.buckets[i] = make([]uint32, 0, per+per/8)
		}
	}
	return c
}

// add records an upsert (or a delete) of the id whose hash is h.
func (c *liveCounter) add(h uint64, upsert bool) {
	e := uint32(h) &^ 1
	if upsert {
		e |= 1
	}
	b := &c.buckets[h>>(64-liveBucketBits)]
	if len(*b) == cap(*b) && cap(*b) >= liveCompactMin {
		c.compact(b)
	}
	*b = append(*b, e)
}

// compact replaces the full bucket *b by the ids its operations leave, as
// upserts, if that frees at least half of it; otherwise *b grows as append
// grows it, and is compacted again once full.
func (c *liveCounter) compact(b *[]uint32) {
	c.replay(*b)
	if 2*c.set.n > cap(*b) {
		return
	}
	out := (*b)[:0]
	for _, v := range c.set.slots {
		if v > 1 {
			out = append(out, v) // bit 0 set: an upsert
		}
	}
	*b = out
}

// replay empties c.set and replays the operations b into it.
func (c *liveCounter) replay(b []uint32) {
	c.set.reset(len(b))
	for _, e := range b {
		if e&1 != 0 {
			c.set.add(e)
		} else {
			c.set.remove(e | 1)
		}
	}
}

// count replays each bucket and returns the ids left.
func (c *liveCounter) count() int {
	n := 0
	for _, b := range c.buckets {
		c.replay(b)
		n += c.set.n
	}
	return n
}

// hashSet is a set of 32-bit hashes: open addressing, linear probing. 0
// marks an empty slot and 1 a removed one; hashes are stored with bit 1
// set, so that they are neither. (Among a million ids, about a hundred
// pairs share 32 bits: the count is low by as many, which does not matter
// to a hint.)
type hashSet struct {
	slots []uint32
	n     int // members
	used  int // slots not empty: members and removed ones
}

// reset empties s and sizes it for hint members without a rehash (add
// grows the table past three quarters full), reusing its table where it is
// large enough.
func (s *hashSet) reset(hint int) {
	need := max(16, hint+hint/2+1)
	if cap(s.slots) >= need {
		s.slots = s.slots[:need]
		clear(s.slots)
	} else {
		s.slots = make([]uint32, need)
	}
	s.n, s.used = 0, 0
}

// home is where h's probe starts: h scaled to the table's size (Lemire's
// multiply-shift), so that the table need not be a power of two.
func (s *hashSet) home(h uint32) int { return int(uint64(h) * uint64(len(s.slots)) >> 32) }

func (s *hashSet) add(h uint32) {
	h |= 2
	if 4*(s.used+1) > 3*len(s.slots) {
		s.rehash()
	}
	free := -1
	for i := s.home(h); ; i = s.next(i) {
		switch v := s.slots[i]; {
		case v == h:
			return
		case v == 1:
			if free < 0 {
				free = i
			}
		case v == 0:
			if free < 0 {
				free = i
				s.used++
			}
			s.slots[free] = h
			s.n++
			return
		}
	}
}

func (s *hashSet) remove(h uint32) {
	h |= 2
	for i := s.home(h); ; i = s.next(i) {
		switch s.slots[i] {
		case h:
			s.slots[i] = 1
			s.n--
			return
		case 0:
			return
		}
	}
}

func (s *hashSet) next(i int) int {
	if i++; i == len(s.slots) {
		return 0
	}
	return i
}

// rehash moves the members to a table with room for twice as many, without
// the removed slots.
func (s *hashSet) rehash() {
	old := s.slots
	c := len(old)
	if 2*s.n >= c/2 {
		c *= 2
	}
	s.slots, s.n, s.used = make([]uint32, c), 0, 0
	for _, v := range old {
		if v > 1 {
			s.add(v)
		}
	}
}
