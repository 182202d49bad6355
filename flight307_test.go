package idemretry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// R6 without any gate: how often does a plain unnamed double tap through a
// 307 charge twice?
func TestFlightUnnamedDoubleTapThrough307NoGate(t *testing.T) {
	var charges atomic.Int32
	var mu sync.Mutex
	keys := map[string]bool{}
	arrived := make(chan struct{}, 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/pay" {
			arrived <- struct{}{}
			time.Sleep(50 * time.Millisecond)
			w.Header().Set("Location", "/v2/pay")
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		}
		k := r.Header.Get("Idempotency-Key")
		mu.Lock()
		if !keys[k] {
			keys[k] = true
			charges.Add(1)
		}
		mu.Unlock()
		w.WriteHeader(201)
	}))
	defer srv.Close()
	tr, _, _ := newTestTransport(t)
	client := &http.Client{Transport: tr}
	const rounds = 30
	for i := 0; i < rounds; i++ {
		body := `{"amount":` + string(rune('a'+i)) + `}`
		var wg sync.WaitGroup
		wg.Add(2)
		tap := func() {
			defer wg.Done()
			resp, err := client.Do(post(t, context.Background(), srv.URL+"/pay", body))
			if assert.NoError(t, err) {
				readAll(t, resp)
			}
		}
		go tap()
		<-arrived
		go tap()
		wg.Wait()
	}
	assert.Equal(t, int32(rounds), charges.Load(), "%d unnamed double taps charged %d times", rounds, charges.Load())
}
