package sqljournal_test

import (
	"context"

	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// settleResumer rebuilds the payment and counts the Resolve calls, with
// the real time of the first.
type settleResumer struct {
	url, order string

	mu       sync.Mutex
	resolved int
	first    time.Time
}

func (r *settleResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(idemretry.WithAction(ctx, rec.ActionID), http.MethodPost, r.url, strings.NewReader(r.order))
}

func (r *settleResumer) Resolve(context.Context, journal.Record) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resolved == 0 {
		r.first = time.Now()
	}
	r.resolved++
	return false, nil
}

// A machine whose clock runs ahead of the database's resolves an action it
// minted itself only after the settle time has passed by the database's
// clock, which its key's creation time is stored by: a Resolve sooner may
// find no charge at the provider while the request is still on its way
// there, and the app pays again.
func TestResolveWaitsForTheSettleTimeWhenTheClockRunsAhead(t *testing.T) {
	const (
		window = 1500 * time.Millisecond
		settle = 4 * time.Second
		ahead  = 40 * time.Second
	)
	db := testDB(t)
	table := newTable(t, db)
	srv := newForgetfulServer(t, window)
	order := `{"order":"settle"}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := transportOn(t, openOn(t, db, table), idemretry.WithKeyWindow(window), idemretry.WithMaxRetries(0),
		idemretry.WithSettleTime(settle), idemretry.WithClock(offsetClock{ahead}))
	start := time.Now()
	if p := post(ctx, m, srv.URL, "pay:settle", order); p.err == nil {
		t.Fatalf("payment: %d %q, want the lost answer's error", p.status, p.body)
	}
	app := &settleResumer{url: srv.URL, order: order}
	for time.Since(start) < window+settle+time.Second {
		if _, err := m.Resume(ctx, app, 0); err != nil {
			t.Fatal(err)
		}
		app.mu.Lock()
		resolved, first := app.resolved, app.first
		app.mu.Unlock()
		if resolved > 0 {
			if early := start.Add(window + settle).Sub(first); early > 0 {
				t.Fatalf("Resolve called %v after the payment, %v before its settle time ended on the database's clock", first.Sub(start), early)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("Resolve never called within %v", window+settle+time.Second)
}
