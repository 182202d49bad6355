package procstat

import (
	"runtime"
	"testing"
	"time"
)

const buf = 64 << 20

// A buffer allocated and still held shows in HeapObjects, and in the peak
// SampleHeapPeak returns (its last reading at least).
func TestHeapObjectsAndPeakSeeAHeldBuffer(t *testing.T) {
	runtime.GC()
	base := HeapObjects()
	if base == 0 {
		t.Fatal("HeapObjects read 0")
	}
	stop := SampleHeapPeak(100 * time.Microsecond)
	b := make([]byte, buf)
	now := HeapObjects()
	peak := stop()
	runtime.KeepAlive(b)
	// Half the buffer, for the little the test runner's own objects may
	// have given back meanwhile.
	if now < base+buf/2 {
		t.Errorf("HeapObjects %d with a %d-byte buffer held, %d before it", now, buf, base)
	}
	if peak < base+buf/2 {
		t.Errorf("peak %d with a %d-byte buffer held, %d before it", peak, buf, base)
	}
}

// Reading the gauge again allocates nothing, so the sampler does not add
// to the allocations of what it measures.
func TestGaugeReadDoesNotAllocate(t *testing.T) {
	g := newGauge()
	if n := testing.AllocsPerRun(100, func() { g.read() }); n != 0 {
		t.Errorf("%v allocations a read", n)
	}
}

// An interval that is not positive samples anyway (time.NewTicker would
// panic in the sampler's goroutine, ending the process).
func TestSampleHeapPeakNonPositiveInterval(t *testing.T) {
	for _, every := range []time.Duration{0, -time.Second} {
		stop := SampleHeapPeak(every)
		if peak := stop(); peak == 0 {
			t.Errorf("every %v: peak 0", every)
		}
	}
}
