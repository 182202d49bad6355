// Package hammer runs a test's load: many goroutines, each doing a number
// of rounds of the same call, as the concurrency tests of every module do.
package hammer

import "sync"

// Run calls f(g, i) for i = 0 to rounds-1 on each of goroutines goroutines
// g = 0 to goroutines-1, all at once, and returns when every call has.
func Run(goroutines, rounds int, f func(g, i int)) {
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				f(g, i)
			}
		}()
	}
	wg.Wait()
}
