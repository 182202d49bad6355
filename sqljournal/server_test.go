package sqljournal_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry"
)

// chargeServer is a loopback payment server with Stripe's idempotency
// semantics: the first request under a key performs the charge and stores
// its answer; a request under a key whose first request is still being
// processed gets 409; a request under a finished key gets the stored answer
// again, marked Idempotent-Replayed: true. Requests without a key are
// refused.
type chargeServer struct {
	*httptest.Server
	// process, if set, runs while the charge numbered n (from 1, over all
	// keys) is in progress: after it is committed, before it is stored and
	// answered. It may block, to play a slow charge.
	process func(n int, key string)

	mu      sync.Mutex
	charges int
	sent    map[string][]string // body -> every key it arrived under, in order
	stored  map[string]string   // key -> stored answer
	busy    map[string]bool     // key -> first request in progress
}

func newChargeServer(t *testing.T) *chargeServer {
	s := &chargeServer{sent: map[string][]string{}, stored: map[string]string{}, busy: map[string]bool{}}
	s.Server = httptest.NewServer(s)
	t.Cleanup(s.Close)
	return s
}

func (s *chargeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	b, _ := io.ReadAll(r.Body)
	body := string(b)
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.sent[body] = append(s.sent[body], key)
	if answer, ok := s.stored[key]; ok {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		io.WriteString(w, answer)
		return
	}
	if s.busy[key] {
		s.mu.Unlock()
		http.Error(w, "a request with this key is in progress", http.StatusConflict)
		return
	}
	s.busy[key] = true
	s.charges++
	n := s.charges
	s.mu.Unlock()

	if s.process != nil {
		s.process(n, key)
	}
	answer := fmt.Sprintf(`{"charge":"ch_%d","key":%q}`, n, key)
	s.mu.Lock()
	s.stored[key] = answer
	delete(s.busy, key)
	s.mu.Unlock()
	io.WriteString(w, answer)
}

// chargeCount returns how many charges the server performed.
func (s *chargeServer) chargeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges
}

// keysOf returns the keys body arrived under, in order.
func (s *chargeServer) keysOf(body string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sent[body]...)
}

// transportOn returns a Transport over j, with its own HTTP connections,
// retrying quickly unless opts say otherwise.
func transportOn(t *testing.T, j journal.Journal, opts ...idemretry.Option) *idemretry.Transport {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	all := append([]idemretry.Option{idemretry.WithJournal(j), idemretry.WithMaxRetries(5),
		idemretry.WithBackOff(func() backoff.BackOff {
			return idemretry.NewFullJitter(time.Millisecond, 10*time.Millisecond, nil)
		})}, opts...)
	tr, err := idemretry.NewTransport(base, all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// payment is what one POST of body through rt returned.
type payment struct {
	status int
	body   string
	replay bool
	err    error
}

// post sends body to url through rt, as a payment named action (if action
// is not empty) or by its fingerprint.
func post(ctx context.Context, rt http.RoundTripper, url, action, body string) payment {
	if action != "" {
		ctx = idemretry.WithAction(ctx, action)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return payment{err: err}
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return payment{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return payment{status: resp.StatusCode, body: string(b), replay: idemretry.IsReplay(resp), err: err}
}

// row is an action's record as the table holds it.
type row struct {
	id, key  string
	state    journal.State
	attempts int
	status   int
}

// rowsOf reads every record of table, oldest first.
func rowsOf(t *testing.T, db *sql.DB, table string) []row {
	t.Helper()
	rs, err := db.QueryContext(context.Background(), `SELECT action_id, key, state, attempts, status FROM "`+table+`" ORDER BY created_at, action_id`)
	if err != nil {
		t.Fatalf("read %s: %v", table, err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		var st int16
		if err := rs.Scan(&r.id, &r.key, &st, &r.attempts, &r.status); err != nil {
			t.Fatal(err)
		}
		r.state = journal.State(st)
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
