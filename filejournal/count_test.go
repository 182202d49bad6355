package filejournal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of countLive and its hash sets (count.go): the size Open gives the
// index.

// countLive, the size recovery gives the index's map, is the number of
// records recovery loads: for a journal of new records only, and for one
// with updates, forgotten records and records created again.
func TestCountLiveIsTheRecordsLoaded(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 5000, countLive(memSource(recoveryJournal(5000))))

	dir := t.TempDir()
	s, _ := mustOpen(t, dir, testOpts())
	ctx := context.Background()
	var es []journal.Record
	for i := range 300 {
		es = append(es, reserve(t, s, entry(fmt.Sprintf("a-%d", i))))
	}
	for _, e := range es[:100] {
		require.NoError(t, s.Forget(ctx, e.ActionID))
	}
	for _, e := range es[100:150] {
		require.NoError(t, update(s, e.ActionID, e.Key, journal.StateDone, 1, 201))
	}
	for _, e := range es[:20] {
		reserve(t, s, entry(e.ActionID))
	}
	require.NoError(t, s.Close())
	data, err := os.ReadFile(filepath.Join(dir, journalName))
	require.NoError(t, err)
	assert.Equal(t, 220, countLive(memSource(data)))
	s, rep := mustOpen(t, dir, testOpts())
	defer s.Close()
	assert.Equal(t, 220, rep.Records)
}

// hashSet counts members through growth, removals and re-additions.
func TestHashSet(t *testing.T) {
	t.Parallel()
	s := new(hashSet)
	s.reset(0)
	for i := range uint32(10_000) {
		s.add(i * 2654435761)
		s.add(i * 2654435761) // again: no change
	}
	require.Equal(t, 10_000, s.n)
	for i := range uint32(5_000) {
		s.remove(i * 2654435761)
		s.remove(i * 2654435761)
	}
	require.Equal(t, 5_000, s.n)
	for i := range uint32(10_000) {
		s.add(i * 2654435761)
	}
	assert.Equal(t, 10_000, s.n)
	assert.LessOrEqual(t, 4*s.used, 3*len(s.slots))
}

// splitmix64 is a fixed stand-in for the ids' hashes: countLive's seed is
// random, and a test must see the same hashes every run.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// liveCounter counts what the operations leave, in their order, whatever
// its first guess: creations, deletions, re-creations after a deletion and
// deletions of ids never created, against a map replaying the same.
func TestLiveCounterFollowsOperationOrder(t *testing.T) {
	t.Parallel()
	for _, hint := range []int{0, 1000, 1 << 20} {
		c := newLiveCounter(hint)
		want := map[uint64]bool{}
		op := func(i int, upsert bool) {
			h := splitmix64(uint64(i))
			c.add(h, upsert)
			if upsert {
				want[h] = true
			} else {
				delete(want, h)
			}
		}
		const n = 100_000
		for i := range n {
			op(i, true)
			op(i, true) // an update: the same id again
		}
		for i := 0; i < n; i += 2 {
			op(i, false)
		}
		for i := 0; i < n; i += 4 {
			op(i, true) // created again after its deletion
		}
		for i := n; i < n+1000; i++ {
			op(i, false) // never created
		}
		for i := 1; i < n; i += 8 {
			op(i, false)
			op(i, true)
			op(i, false)
		}
		require.Equal(t, len(want), c.count(), "hint %d", hint)
	}
}

// hashSet.reset sizes the table so that as many members as it was told
// fit without a rehash, and reuses a table that is large enough.
func TestHashSetResetHoldsItsHint(t *testing.T) {
	t.Parallel()
	var s hashSet
	for _, hint := range []int{0, 5, 16, 100, 4000, 3000} {
		s.reset(hint)
		size := len(s.slots)
		for i := range uint32(hint) {
			s.add(uint32(splitmix64(uint64(i))))
		}
		require.Equal(t, size, len(s.slots), "rehashed with %d members", hint)
		require.LessOrEqual(t, s.n, hint)
	}
	big := cap(s.slots)
	s.reset(10)
	require.Equal(t, big, cap(s.slots), "a large enough table was not reused")
	require.Zero(t, s.n)
	for _, v := range s.slots {
		require.Zero(t, v)
	}
}

// TestLiveBytesMatchReplay: the live-bytes estimate that compaction is
// judged by, kept by Reserve, Update (which changes a record in place) and
// Forget, equals the one a reopen computes by replaying the file, record
// by record; and the records read back are the ones written. Updates cross
// the varint boundaries of attempts and status, so the encoded size of a
// record changes with them, and keys are both UUIDs and custom strings.
func TestLiveBytesMatchReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, _ := mustOpen(t, dir, testOpts())
	ctx := context.Background()
	var want []journal.Record
	for i := range 40 {
		e := benchEntry(i)
		if i%3 == 0 {
			e.Key = fmt.Sprintf("custom-key-%d", i) // not a UUID: kept as a string
		}
		got, created, err := j.Reserve(ctx, e, journal.ReuseAny)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, e.Key, got.Key)
		for _, a := range []int{1, 127, 128, 300, 20000} {
			e.Attempts = a
			e.Status = a % 600
			require.NoError(t, j.Update(ctx, e))
		}
		if i%4 == 0 {
			e.State, e.Status = journal.StateDone, 201
			require.NoError(t, j.Update(ctx, e))
		}
		if i%5 == 0 {
			require.NoError(t, j.Forget(ctx, e.ActionID))
			continue
		}
		want = append(want, e)
	}
	before := j.stats()
	require.NoError(t, j.Close())

	j, _ = mustOpen(t, dir, testOpts())
	defer j.Close()
	after := j.stats()
	require.Equal(t, before.Records, after.Records)
	require.Equal(t, before.LiveBytes, after.LiveBytes, "live bytes kept while open differ from those replay computes")
	for _, e := range want {
		got, created, err := j.Reserve(ctx, e, journal.ReuseAny)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, e.Key, got.Key)
		require.Equal(t, e.State, got.State)
		require.Equal(t, e.Attempts, got.Attempts)
		require.Equal(t, e.Status, got.Status)
	}
}

// TestHashSetGrowsPastCountHint: countLive's table starts at most at
// maxCountHint records; a journal of more live records than that grows it,
// and the count stays exact (hashes distinct, bit 1 clear, spread over the
// table as real ones are).
func TestHashSetGrowsPastCountHint(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("6M hashes")
	}
	key := func(i uint32) uint32 { return (i * 0x2c1b3c6d & (1<<30 - 1)) << 2 } // a bijection on 30 bits
	n := uint32(maxCountHint + maxCountHint/2)
	s := new(hashSet)
	s.reset(maxCountHint)
	start := len(s.slots)
	for i := range n {
		s.add(key(i))
	}
	require.Equal(t, int(n), s.n)
	require.Greater(t, len(s.slots), start, "the table grew past its first guess")
	for i := range n / 3 {
		s.remove(key(i))
	}
	require.Equal(t, int(n-n/3), s.n)
	for i := range n + n/3 {
		s.add(key(i))
	}
	require.Equal(t, int(n+n/3), s.n)
	require.LessOrEqual(t, 4*s.used, 3*len(s.slots))
}

// opsJournal returns a journal of about size bytes whose frames (payloads
// of up to 256 KiB) hold the operations mk(0), mk(1), ... in order.
func opsJournal(size int, mk func(i int) op) []byte {
	gen := uint32(7)
	buf := header{gen: gen, flags: formatFlags, baseSeq: 1}.append(nil)
	seq := uint64(1)
	var ops []op
	plen := 0
	for i := 0; len(buf) < size; i++ {
		o := mk(i)
		ops = append(ops, o)
		plen += len(appendOp(nil, &o))
		if plen >= 256<<10 {
			buf = appendFrame(buf, gen, seq, appendPayload(nil, ops))
			seq, ops, plen = seq+1, ops[:0], 0
		}
	}
	return buf
}

// countLiveAlloc returns countLive's result for data and the bytes it
// allocated.
func countLiveAlloc(data []byte) (int, uint64) {
	src := memSource(data)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := countLive(src)
	runtime.ReadMemStats(&after)
	return n, after.TotalAlloc - before.TotalAlloc
}

// TestCountLiveMemoryFollowsRecordsNotOperations: recovery reads the
// file through one window so that it "holds the index, not the index and
// the file" (open.go), and countLive's own memory used to follow the ids
// it counts (a set of them, first sized from the file at one entry per 64
// bytes, capped). Since 256835c it keeps every operation of the file, 4
// bytes each in its buckets (more while they grow), and replays a bucket
// into a set sized for all of that bucket's operations: a file that
// repeats one id (a record updated over and over, or a crafted or damaged
// file of deletes, 3 bytes each) puts every operation in one bucket, so
// countLive allocates several times the file's size for a journal that
// leaves at most one record. Its allocation must stay within the budget
// its first guess justifies (here a quarter of the file), as it did.
func TestCountLiveMemoryFollowsRecordsNotOperations(t *testing.T) {
	const size = 16 << 20
	upsert := func(id string) op {
		r := rec{id: id, state: journal.StatePending, seen: 1}
		r.key[6] = 0x40
		r.key[8] = 0x80
		return op{kind: opUpsert, r: r}
	}
	for _, c := range []struct {
		name string
		mk   func(i int) op
		want int
	}{
		{"deletes of one id", func(int) op { return op{kind: opDelete, r: rec{id: "x"}} }, 0},
		{"deletes of distinct ids", func(i int) op {
			return op{kind: opDelete, r: rec{id: string([]byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)})}}
		}, 0},
		{"updates of one id", func(int) op { return upsert("order-1") }, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := opsJournal(size, c.mk)
			n, alloc := countLiveAlloc(data)
			require.Equal(t, c.want, n)
			t.Logf("file %.1f MB: countLive allocated %.1f MB", float64(len(data))/1e6, float64(alloc)/1e6)
			require.Less(t, alloc, uint64(len(data)/4), "countLive allocated %.1f MB for a %.1f MB journal that leaves %d records",
				float64(alloc)/1e6, float64(len(data))/1e6, n)
		})
	}
}

// TestCountLiveHintBounded: countLive sizes its set from the file's size
// before it has read a frame, about one record per 64 bytes. A journal whose
// size says nothing of its records (here a valid header, then a hole: 4 GiB
// of zeros that take no disk, as a crafted or damaged file can be) made it
// allocate 333 MB at once (a 64 GiB one, 5.3 GB), before finding no frame
// at all. The first guess is capped; the set grows as records come.
func TestCountLiveHintBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), journalName)
	hdr := header{minor: versionMinor, flags: formatFlags, gen: 5, baseSeq: 1}.append(nil)
	require.NoError(t, os.WriteFile(path, hdr, 0o600))
	require.NoError(t, os.Truncate(path, 4<<30))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	src, err := openSource(f)
	require.NoError(t, err)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := countLive(src)
	runtime.ReadMemStats(&after)
	require.Zero(t, n)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "allocated by countLive for a file of 4 GiB without a frame")

	// The set still grows to whatever the records need.
	s := new(hashSet)
	s.reset(0)
	distinct := map[uint32]bool{}
	for i := range 100000 {
		h := uint32(i) * 2654435761
		s.add(h)
		distinct[h|2] = true // as the set stores it
	}
	require.Equal(t, len(distinct), s.n)
}
