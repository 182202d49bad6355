// Package procstat reads what the benchmarks measure of their own process
// besides wall time: the CPU time it has used, which a shared machine's
// neighbours disturb much less, and the heap its objects take, sampled
// for the peak of an operation. The file journal's benchmarks and the
// bench module read them through this one package.
package procstat

import (
	"runtime/metrics"
	"time"
)

// heapObjectsMetric is the heap in use by objects, live or not yet swept
// (MemStats.HeapAlloc), read without stopping the world.
const heapObjectsMetric = "/memory/classes/heap/objects:bytes"

// HeapObjects returns the bytes of heap objects, live or not yet swept.
func HeapObjects() uint64 {
	return newGauge().read()
}

// SampleHeapPeak reads HeapObjects every interval, from a goroutine of its
// own that allocates nothing per sample, until stop is called; stop returns
// the highest reading, taken once more at the end. Sampled, it is a close
// lower bound of the true peak. An interval that is not positive samples
// every millisecond. Call stop once.
func SampleHeapPeak(every time.Duration) (stop func() uint64) {
	if every <= 0 {
		every = time.Millisecond // time.NewTicker would panic in the sampler
	}
	g := newGauge()
	peak := g.read() // the goroutine's until done is closed
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				peak = max(peak, g.read())
			}
		}
	}()
	return func() uint64 {
		close(quit)
		<-done
		return max(peak, g.read())
	}
}

// gauge reads heapObjectsMetric into a sample of its own, so that reading
// it again allocates nothing.
type gauge []metrics.Sample

func newGauge() gauge {
	return gauge{{Name: heapObjectsMetric}}
}

func (g gauge) read() uint64 {
	metrics.Read(g)
	if g[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return g[0].Value.Uint64()
}
