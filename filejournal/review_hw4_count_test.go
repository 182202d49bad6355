package filejournal

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHW4HashSetGrowsPastCountHint: countLive's table starts at most at
// maxCountHint records; a journal of more live records than that grows it,
// and the count stays exact (hashes distinct, bit 1 clear, spread over the
// table as real ones are).
func TestHW4HashSetGrowsPastCountHint(t *testing.T) {
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
