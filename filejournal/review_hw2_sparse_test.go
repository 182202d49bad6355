package filejournal

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHW2CountLiveHintBounded: countLive sizes its set from the file's size
// before it has read a frame, about one record per 64 bytes. A journal whose
// size says nothing of its records (here a valid header, then a hole: 4 GiB
// of zeros that take no disk, as a crafted or damaged file can be) made it
// allocate 333 MB at once (a 64 GiB one, 5.3 GB), before finding no frame
// at all. The first guess is capped; the set grows as records come.
func TestHW2CountLiveHintBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), journalName)
	hdr := header{minor: versionMinor, flags: flagSeen, gen: 5, baseSeq: 1}.append(nil)
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
