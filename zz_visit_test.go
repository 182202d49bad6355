package idemretry_test

import (
	"context"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// One unnamed payment, led, with one double tap joining it: the request
// whose way through the code is counted.
func TestZZVisit(t *testing.T) {
	srv := newSlowPayServer(t, 200*time.Millisecond)
	tr, _, _ := newTestTransport(t)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
		if i == 0 {
			<-srv.arrived
		}
	}
	wg.Wait()
	_ = os.Stdout
}
