package sqljournal_test

import (
	"context"
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

// stripeLike is a payment server with Stripe's idempotency semantics: the
// first request under a key performs the charge and stores the answer;
// later ones replay it; one arriving while the first is in progress gets
// 409. To play a lost response, the first request of each key is committed
// and then its connection is dropped without an answer.
type stripeLike struct {
	mu      sync.Mutex
	charges map[string]int // order -> charges performed
	seen    map[string]map[string]int
	done    map[string]string // key -> stored answer
	busy    map[string]bool   // key -> first request in progress
	t       *testing.T
}

func newStripeLike(t *testing.T) *stripeLike {
	return &stripeLike{t: t, charges: map[string]int{},
		seen: map[string]map[string]int{}, done: map[string]string{}, busy: map[string]bool{}}
}

func (s *stripeLike) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	order := string(body)
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if s.seen[order] == nil {
		s.seen[order] = map[string]int{}
	}
	s.seen[order][key]++
	if answer, ok := s.done[key]; ok {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		io.WriteString(w, answer)
		return
	}
	if s.busy[key] {
		s.mu.Unlock()
		http.Error(w, "request in progress", http.StatusConflict)
		return
	}
	s.busy[key] = true
	s.mu.Unlock()

	// The charge, committed under the key before any answer leaves.
	s.mu.Lock()
	s.charges[order]++
	answer := fmt.Sprintf(`{"charge":"ch_%s_%d"}`, order, s.charges[order])
	s.done[key] = answer
	delete(s.busy, key)
	s.mu.Unlock()

	// Committed, and then the answer is lost on the way back.
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.t.Errorf("hijack: %v", err)
		return
	}
	conn.Close()
}

// machine is one backend of the fleet: its own pool, journal and HTTP
// connections; only the database is shared.
func machine(t *testing.T, table string) *http.Client {
	t.Helper()
	tr := transportOn(t, openOn(t, testDB(t), table), idemretry.WithMaxRetries(10),
		idemretry.WithBackOff(func() backoff.BackOff {
			return idemretry.NewFullJitter(time.Millisecond, 20*time.Millisecond, nil)
		}))
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func pay(t *testing.T, c *http.Client, url, order string) string {
	t.Helper()
	ctx := idemretry.WithAction(context.Background(), "pay:"+order)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(order))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("pay %s: %v", order, err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("pay %s: %s %s", order, resp.Status, b)
	}
	return string(b)
}

// Two machines send the same payment action, one after the other and then
// both at once, through a server that loses the first answer: the server
// sees one key per action and charges once.
func TestTwoMachinesOneCharge(t *testing.T) {
	srv := newStripeLike(t)
	ts := httptest.NewServer(srv)
	defer ts.Close()
	probe := testDB(t)
	table := newTable(t, probe)
	a, b := machine(t, table), machine(t, table)

	// One after the other: B finds A's done record and replays its answer.
	first := pay(t, a, ts.URL, "order-1")
	if again := pay(t, b, ts.URL, "order-1"); again != first || first == "" {
		t.Errorf("machine B got %q, machine A %q: want the same stored answer", again, first)
	}

	// At once, several requests per machine.
	var wg sync.WaitGroup
	answers := make(chan string, 10)
	for i := range 10 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers <- pay(t, c, ts.URL, "order-2")
		}()
	}
	wg.Wait()
	close(answers)
	for ans := range answers {
		if ans != `{"charge":"ch_order-2_1"}` {
			t.Errorf("concurrent payment answered %q", ans)
		}
	}

	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, order := range []string{"order-1", "order-2"} {
		if srv.charges[order] != 1 {
			t.Errorf("%s charged %d times, want once", order, srv.charges[order])
		}
		if len(srv.seen[order]) != 1 {
			t.Errorf("%s arrived under %d keys %v, want one", order, len(srv.seen[order]), srv.seen[order])
		}
		var (
			stored        string
			state, status int
		)
		if err := probe.QueryRow(`SELECT key, state, status FROM "`+table+`" WHERE action_id = $1`, "pay:"+order).
			Scan(&stored, &state, &status); err != nil {
			t.Fatal(err)
		}
		if journal.State(state) != journal.StateDone || status != http.StatusOK {
			t.Errorf("%s: journal state %v, status %d; want done, 200", order, journal.State(state), status)
		}
		if srv.seen[order][stored] == 0 {
			t.Errorf("%s: journal key %s never reached the server (saw %v)", order, stored, srv.seen[order])
		}
	}
	for _, n := range srv.seen["order-1"] {
		if n < 3 {
			t.Errorf("order-1 reached the server %d times, want the dropped attempt, its retry and machine B's", n)
		}
	}
}
