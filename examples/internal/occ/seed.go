package occ

import (
	"hash/fnv"
	"math/rand/v2"
)

// RunRand returns the random source of one run. It depends only on the seed
// and the run's own coordinates (strategy, clients, run index), never on
// which worker runs it or which other cells are in the sweep: the sweep can
// be spread over any number of cores, or narrowed with -clients, and every
// cell it does run comes out the same.
func RunRand(seed int64, strategy string, clients, run int) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(strategy))
	stream := splitmix(h.Sum64() ^ splitmix(uint64(clients)<<32|uint64(run)))
	return rand.New(rand.NewPCG(uint64(seed), stream))
}

// splitmix is SplitMix64's finaliser: it spreads nearby inputs (run 7 and
// run 8) over unrelated PCG streams.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
