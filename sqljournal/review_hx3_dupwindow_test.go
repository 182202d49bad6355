package sqljournal_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
)

// A double tap of an unnamed payment within the duplicate window
// (WithDuplicateWindow) is the same payment, sent under the same key, on a
// machine whose clock runs ahead of the database's (equally: a database
// whose clock runs behind the application servers'). Reserve stores the
// database's time when it is the earlier, so the window must be judged by a
// time no later than the database's, or every repeat counts as a new
// payment as soon as the clocks disagree by more than the window. On a
// machine whose clock runs behind the database's, the Transport judges
// windows by the database's time (the Journal is a journal.Timekeeper),
// while the record keeps the machine's time: the same, the other way.
func TestReviewHX3DuplicateWindowHeldWhenTheDatabaseClockIsBehind(t *testing.T) {
	for _, off := range []time.Duration{0, 2 * time.Minute, -2 * time.Minute} {
		t.Run(off.String(), func(t *testing.T) {
			var mu sync.Mutex
			charges := map[string]int{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				charges[r.Header.Get("Idempotency-Key")]++
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"charged":"`+string(b)+`"}`)
			}))
			defer srv.Close()
			db := testDB(t)
			j, _ := openJournal(t, db)
			tr := transportOn(t, j, idemretry.WithDuplicateWindow(time.Minute), idemretry.WithClock(offsetClock{off}))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			first := post(ctx, tr, srv.URL, "", `{"order":"tap"}`)
			second := post(ctx, tr, srv.URL, "", `{"order":"tap"}`)
			if first.err != nil || second.err != nil {
				t.Fatalf("taps: %v, %v", first.err, second.err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(charges) != 1 { // the server charges once per key
				t.Errorf("clock %v ahead of the database's: a double tap within the duplicate window charged under %d keys (%v), want one",
					off, len(charges), charges)
			}
		})
	}
}
