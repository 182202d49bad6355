package idemretry_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Resume reads and closes the final answer of each action it sends. Under a
// context that never ends, a body that never ends (one streamed forever, or
// one that stalls after its first bytes) must not keep Resume from
// returning: it is drained as any discarded body is, up to 64 KiB and for at
// most DefaultMaxDrainTime, and the action's outcome (201, recorded done)
// is what Resume reports.
func TestResumeBoundsTheFinalBodyDrain(t *testing.T) {
	for _, tc := range []struct {
		name string
		body func(w http.ResponseWriter, r *http.Request)
	}{
		{"streams forever", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			chunk := []byte(strings.Repeat("x", 1024))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond)
			}
		}},
		{"stalls", func(w http.ResponseWriter, r *http.Request) {
			stallBody(w, r, http.StatusCreated, `{"id":`, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					hijackAndClose(w) // the first answer is lost: the action stays pending
					return
				}
				tc.body(w, r)
			})
			j := journal.NewMemory()
			leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:A"), srv.URL, `{"order":"A"}`))

			second, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
			require.NoError(t, err)
			defer second.Close()
			r := &appResumer{url: srv.URL, orders: map[string]string{"pay:A": `{"order":"A"}`}}

			// ctx has no deadline and is cancelled only to free the test
			// if Resume hangs.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Now()
			done := resumeAsync(ctx, second, r, 1)
			var got resumed
			select {
			case got = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Resume did not return within 10 s of a final answer whose body never ends")
			}
			took := time.Since(start)
			require.NoError(t, got.err)
			require.Len(t, got.res, 1)
			assert.True(t, got.res[0].Sent)
			assert.Equal(t, http.StatusCreated, got.res[0].Status)
			assert.NoError(t, got.res[0].Err)
			assert.True(t, got.res[0].BodyTruncated, "a body cut says so")
			assert.Less(t, took, 5*time.Second, "the drain is bounded by DefaultMaxDrainTime (%v)", idemretry.DefaultMaxDrainTime)
			left, err := j.Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, left, "the 201 is recorded done")
			checkNoPackageGoroutines(t)
		})
	}
}
