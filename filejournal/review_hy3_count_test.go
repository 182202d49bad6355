package filejournal

import (
	"runtime"
	"testing"

	"github.com/idemretry/idemretry/journal"
	"github.com/stretchr/testify/require"
)

// opsJournal returns a journal of about size bytes whose frames (payloads
// of up to 256 KiB) hold the operations mk(0), mk(1), ... in order.
func opsJournal(size int, mk func(i int) op) []byte {
	gen := uint32(7)
	buf := header{gen: gen, flags: flagSeen, baseSeq: 1}.append(nil)
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

// TestHY3CountLiveMemoryFollowsRecordsNotOperations: recovery reads the
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
func TestHY3CountLiveMemoryFollowsRecordsNotOperations(t *testing.T) {
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
