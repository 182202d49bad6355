package idemretry_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hX2's review: the app closes the Client (it is exiting) while other
// threads pay, list, sync, forget and resume. Close returns promptly;
// every call ends, none panics, and each error has a kind the app branches
// on: KindClosed for a call made after Close, KindMaybeProcessed for a
// payment cut short after it may have reached the server (never one
// that says "not charged" about a charged payment). The next Client finds
// every payment charged once, under the key it holds.
func TestReviewHX2CloseWhileBusy(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(func(w http.ResponseWriter, r *http.Request) bool {
		select { // a slow charge: payments are in flight at Close
		case <-time.After(100 * time.Millisecond):
		case <-r.Context().Done():
		}
		return false
	})
	c, dir := open(t, nil)
	var wg sync.WaitGroup
	start := make(chan struct{})
	kinds := make(chan int32, 1000)
	maybe := 0
	var mu sync.Mutex
	paid := map[string]bool{}
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; ; i++ {
				id := fmt.Sprintf("pay:g%d-%d", g, i%3)
				var err error
				switch i % 5 {
				case 0, 1, 2:
					var resp *idemretry.Response
					resp, err = c.Send(payment(srv, id, "10"))
					if err == nil {
						mu.Lock()
						paid[id] = true
						mu.Unlock()
						assert.EqualValues(t, 200, resp.Status)
					}
				case 3:
					_, err = c.Unfinished()
					if err == nil {
						err = c.Sync()
					}
				case 4:
					_, err = c.Resume(rebuildWith(func(a string) (*idemretry.Request, error) { return payment(srv, "", "10"), nil }))
				}
				if err != nil {
					kinds <- idemretry.ErrorKind(err)
					if idemretry.ErrorKind(err) == idemretry.KindClosed {
						return
					}
				}
			}
		}()
	}
	close(start)
	time.Sleep(300 * time.Millisecond)
	closed := time.Now()
	require.NoError(t, c.Close())
	assert.Less(t, time.Since(closed), 10*time.Second)
	wg.Wait()
	close(kinds)
	for k := range kinds {
		assert.Contains(t, []int32{idemretry.KindClosed, idemretry.KindMaybeProcessed}, k)
		if k == idemretry.KindMaybeProcessed {
			maybe++
		}
	}
	t.Logf("%d payments cut short by Close", maybe)

	srv.setAfterCommit(nil)
	c2, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Resume(rebuildWith(func(a string) (*idemretry.Request, error) { return payment(srv, "", "10"), nil }))
	require.NoError(t, err)
	l, err := c2.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len())
	_, charges := srv.snapshot()
	for k, n := range charges {
		assert.Equal(t, 1, n, "key %s", k)
	}
	assert.LessOrEqual(t, len(charges), 18)
	assert.NotEmpty(t, paid)
}

// hX2's review: the app closes the Client (it is exiting) while Resume
// works through the actions a killed run left: Resume stops calling the
// app's Rebuilder (its database may be closed by now) and reports the
// actions left as KindClosed, skipped, nothing sent.
func TestReviewHX2CloseStopsResume(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	c, err := idemretry.NewClient(filepath.Join(t.TempDir(), "idemretry"), nil)
	require.NoError(t, err)
	defer c.Close()
	for _, id := range []string{"pay:1", "pay:2", "pay:3"} {
		r := payment(srv, id, "1")
		r.TimeoutMillis = 1000
		_, err := c.Send(r)
		require.Equal(t, idemretry.KindMaybeProcessed, kindOf(t, err), "%v", err)
	}
	srv.setAfterCommit(nil)
	sent := srv.requestCount()
	var rebuilt []string
	out, err := c.Resume(rebuildWith(func(id string) (*idemretry.Request, error) {
		rebuilt = append(rebuilt, id)
		require.NoError(t, c.Close()) // the app exits
		return payment(srv, "", "1"), nil
	}))
	require.NoError(t, err)
	assert.Equal(t, []string{"pay:1"}, rebuilt, "Rebuild called after Close")
	require.EqualValues(t, 3, out.Len())
	for i := int32(0); i < out.Len(); i++ {
		o := out.Get(i)
		require.NotNil(t, o.Failure)
		assert.Equal(t, idemretry.KindClosed, o.Failure.Kind, o.Failure.Message)
		assert.Equal(t, o.ActionID, o.Failure.ActionID)
	}
	assert.True(t, out.Get(1).Skipped)
	assert.Equal(t, sent, srv.requestCount())
}
