package interop

// How an app resends what the retry budget parked.

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// During an outage of the Fiber shop (the proxy answers 503 for 2 s), the
// budget parks an order once its tokens are spent; from then on every send
// of the parked action is one request (a first attempt, which the budget
// never refuses) that parks it again. How many requests the outage costs
// is the app's resend schedule: measured here, a resend every 50 ms against
// a doubling wait from 250 ms (capped at 2 s). Both charge the order once:
// every send carries the action's one key.
func TestParkedActionResendSchedule(t *testing.T) {
	for _, s := range []struct {
		name string
		next func(prev time.Duration) time.Duration
	}{
		{"every 50 ms", func(time.Duration) time.Duration { return 50 * time.Millisecond }},
		{"doubling from 250 ms, cap 2 s", func(prev time.Duration) time.Duration {
			if prev == 0 {
				return 250 * time.Millisecond
			}
			return min(2*prev, 2*time.Second)
		}},
	} {
		t.Run(s.name, func(t *testing.T) {
			shop := newFiberShop(t)
			proxy := newFaultProxy(t, shop.url)
			var mu sync.Mutex
			end := time.Now().Add(2 * time.Second)
			proxy.setPlan(func(int) fault {
				mu.Lock()
				defer mu.Unlock()
				if time.Now().Before(end) {
					return unavailable
				}
				return pass
			})
			tr, _ := newTransport(t, nil, idemretry.WithKeyHeader("X-Idempotency-Key"), idemretry.WithBackOff(noWait))
			ctx := idemretry.WithAction(bg, "pay:P-1")
			sends, parked := 0, 0
			var wait time.Duration
			start := time.Now()
			for {
				sends++
				resp, err := tr.RoundTrip(post(t, ctx, proxy.URL+"/orders", order("P-1")))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusCreated {
						break
					}
				} else {
					require.ErrorIs(t, err, idemretry.ErrParked)
					parked++
				}
				require.Less(t, sends, 500, "bounded")
				wait = s.next(wait)
				time.Sleep(wait)
			}
			t.Logf("%-30s: %3d sends (%d parked), %3d requests, paid %.1f s after the outage began, charged %d",
				s.name, sends, parked, proxy.requests(), time.Since(start).Seconds(), shop.chargesOf("P-1"))
			assert.Equal(t, 1, shop.chargesOf("P-1"))
			assert.Positive(t, parked, "the budget parked the order")
		})
	}
}
