package hammer

import (
	"sync"
	"testing"
)

func TestRunCallsEveryRoundOfEveryGoroutine(t *testing.T) {
	var mu sync.Mutex
	seen := map[[2]int]int{}
	Run(7, 13, func(g, i int) {
		mu.Lock()
		defer mu.Unlock()
		seen[[2]int{g, i}]++
	})
	if len(seen) != 7*13 {
		t.Fatalf("%d distinct calls, want %d", len(seen), 7*13)
	}
	for k, n := range seen {
		if n != 1 || k[0] < 0 || k[0] >= 7 || k[1] < 0 || k[1] >= 13 {
			t.Fatalf("call %v made %d times", k, n)
		}
	}
}
