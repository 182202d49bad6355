package sqljournal_test

// A fleet under faults: three machines (Transports with pools of their own,
// clocks up to 20 s apart, short leases) share one PostgreSQL journal on a
// cluster of the test's own and pay orders by action id, retrying what
// fails, while two of them run Resume again and again. The payment server
// loses answers after committing charges, charges slowly (longer than the
// lease), and answers 503 at random; the journal's connections are killed
// with pg_terminate_backend, and the database is crashed (stopped in
// immediate mode) and restarted in the middle of it. The server's ledger
// must show every order charged once, under one key; no machine may be
// told an order was paid that the server did not charge under that key;
// every error must be typed; and once the faults stop, Resume must leave
// nothing unfinished.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// chaosServer is a payment server with Stripe's semantics and injected
// faults, keeping a ledger by order (the body) and key.
type chaosServer struct {
	*httptest.Server
	mu      sync.Mutex
	rnd     *rand.Rand
	stored  map[string]string   // key -> answer
	busy    map[string]bool     // key -> in progress
	charges map[string][]string // order -> the keys it was charged under
	keys    map[string]map[string]bool
}

func newChaosServer(t *testing.T, seed uint64) *chaosServer {
	s := &chaosServer{rnd: rand.New(rand.NewPCG(seed, 1)), stored: map[string]string{}, busy: map[string]bool{},
		charges: map[string][]string{}, keys: map[string]map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *chaosServer) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	b, _ := io.ReadAll(r.Body)
	order := string(b)
	s.mu.Lock()
	if s.keys[order] == nil {
		s.keys[order] = map[string]bool{}
	}
	s.keys[order][key] = true
	if a, ok := s.stored[key]; ok {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		io.WriteString(w, a)
		return
	}
	if s.busy[key] {
		s.mu.Unlock()
		http.Error(w, "in progress", http.StatusConflict)
		return
	}
	if s.rnd.IntN(10) == 0 {
		s.mu.Unlock()
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	s.busy[key] = true
	s.charges[order] = append(s.charges[order], key)
	slow := time.Duration(s.rnd.IntN(600)) * time.Millisecond
	drop := s.rnd.IntN(3) == 0
	s.mu.Unlock()
	time.Sleep(slow)
	answer := fmt.Sprintf(`{"order":%q,"key":%q}`, order, key)
	s.mu.Lock()
	s.stored[key] = answer
	delete(s.busy, key)
	s.mu.Unlock()
	if drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	io.WriteString(w, answer)
}

func (s *chaosServer) ledger(order string) (charges []string, keys int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.charges[order]...), len(s.keys[order])
}

// chaosResumer rebuilds an order's payment from its action id.
type chaosResumer struct{ url string }

func (r chaosResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	order, ok := strings.CutPrefix(rec.ActionID, "pay:")
	if !ok {
		return nil, nil
	}
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(order))
}

func (chaosResumer) Resolve(context.Context, journal.Record) (bool, error) {
	return false, errors.New("no outcome-unknown action expected: the key window is a day")
}

// typedErr reports whether err is one a payment app can act on.
func typedErr(err error) bool {
	var ae *idemretry.ActionError
	if errors.As(err, &ae) {
		return true
	}
	for _, s := range []error{journal.ErrUnavailable, context.DeadlineExceeded, context.Canceled,
		idemretry.ErrAttemptsExhausted, idemretry.ErrRetryAfterTooLong, idemretry.ErrWaitExceedsDeadline,
		idemretry.ErrParked, idemretry.ErrLeaseHeld, idemretry.ErrLeaseLost, idemretry.ErrOutcomeUnknown,
		idemretry.ErrNotResumable, idemretry.ErrKeyWindowExpired} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func TestReviewHX1FleetUnderFaults(t *testing.T) {
	c := ownCluster(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	srv := newChaosServer(t, seed)
	setup := c.db()
	table := newTable(t, setup)
	if _, err := sqljournal.Open(context.Background(), setup, sqljournal.WithTable(table)); err != nil {
		t.Fatal(err)
	}

	offsets := []time.Duration{0, 20 * time.Second, -20 * time.Second}
	machines := make([]*idemretry.Transport, len(offsets))
	for i, off := range offsets {
		db := c.db()
		db.SetConnMaxIdleTime(time.Second)
		j, err := sqljournal.Open(context.Background(), db, sqljournal.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		machines[i] = transportOn(t, j, idemretry.WithClock(offsetClock{off}), idemretry.WithLeaseTTL(300*time.Millisecond),
			idemretry.WithMaxRetries(3), idemretry.WithJournalTimeout(time.Second),
			idemretry.WithBackOff(func() backoff.BackOff { return idemretry.NewFullJitter(5*time.Millisecond, 50*time.Millisecond, nil) }))
	}

	const orders = 24
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		paidWith = map[string]string{} // order -> the key of an answer a machine was given
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		t.Errorf(format, args...)
	}
	var errs sync.Map // error kind -> *atomic.Int64
	count := func(kind string) {
		v, _ := errs.LoadOrStore(kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	checkAnswer := func(order string, p payment) {
		switch {
		case errors.Is(p.err, journal.ErrUnavailable):
			count("journal unavailable")
		case p.err != nil:
			count("other error")
		default:
			count(fmt.Sprint(p.status))
		}
		if p.err != nil {
			if !typedErr(p.err) {
				fail("order %s: untyped error %T: %v", order, p.err, p.err)
			}
			return
		}
		if p.status != http.StatusOK {
			return // a give-up on a 503 or 409: the action stays pending
		}
		var gotOrder, gotKey string
		if _, err := fmt.Sscanf(strings.NewReplacer(`{"order":`, "", `,"key":`, " ", "}", "").Replace(p.body), "%q %q", &gotOrder, &gotKey); err != nil || gotOrder != order {
			fail("order %s answered %q", order, p.body)
			return
		}
		charged, _ := srv.ledger(order)
		if len(charged) == 0 || charged[0] != gotKey {
			fail("order %s reported paid under key %s; the server charged it under %v", order, gotKey, charged)
		}
		mu.Lock()
		paidWith[order] = gotKey
		mu.Unlock()
	}

	// Faults: kill the machines' connections now and then, and crash the
	// database once.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewPCG(seed, 2))
		crashed := false
		for start := time.Now(); !stop.Load(); time.Sleep(time.Duration(20+rnd.IntN(80)) * time.Millisecond) {
			if !crashed && time.Since(start) > 1500*time.Millisecond {
				crashed = true
				if err := c.pgCtl("-m", "immediate", "-w", "stop"); err != nil {
					fail("crash the database: %v", err)
					return
				}
				time.Sleep(300 * time.Millisecond)
				if err := c.pgCtl("-l", c.base+"/server.log", "-w", "-t", "60", "-o", "-p "+c.port, "start"); err != nil {
					fail("restart the database: %v", err)
					return
				}
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = setup.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND random() < 0.3`)
			cancel()
		}
	}()

	// Two machines resume over and over.
	for _, m := range machines[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				results, err := m.Resume(ctx, chaosResumer{srv.URL}, 0)
				cancel()
				if err != nil && !typedErr(err) {
					fail("Resume: untyped error %T: %v", err, err)
				}
				for _, r := range results {
					if r.Err != nil && !typedErr(r.Err) {
						fail("Resume of %s: untyped error %T: %v", r.Record.ActionID, r.Err, r.Err)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}

	// The app: each order paid until a machine is told it is, from random
	// machines, for a while.
	var payers sync.WaitGroup
	for i := range orders {
		payers.Add(1)
		go func() {
			defer payers.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(10+i)))
			order := fmt.Sprintf("order-%d", i)
			time.Sleep(time.Duration(rnd.IntN(3000)) * time.Millisecond) // spread around the crash
			for try := 0; try < 12; try++ {
				m := machines[rnd.IntN(len(machines))]
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(200+rnd.IntN(1500))*time.Millisecond)
				p := post(ctx, m, srv.URL, "pay:"+order, order)
				cancel()
				checkAnswer(order, p)
				if p.err == nil && p.status == http.StatusOK {
					return
				}
				time.Sleep(time.Duration(rnd.IntN(200)) * time.Millisecond)
			}
		}()
	}
	payers.Wait()
	stop.Store(true)
	wg.Wait()

	// Faults over: resume until nothing is left.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := 0; ; round++ {
		results, err := machines[0].Resume(ctx, chaosResumer{srv.URL}, 0)
		if err != nil && (!errors.Is(err, journal.ErrUnavailable) || round == 20) {
			// A pooled connection the crash cut may fail one call.
			t.Fatalf("final Resume: %v", err)
		}
		left := 0
		if err != nil {
			left++
		}
		for _, r := range results {
			if err != nil || r.Err != nil || r.Status != http.StatusOK {
				left++
				t.Logf("final Resume %d: %s: %d %v", round, r.Record.ActionID, r.Status, r.Err)
			}
		}
		if left == 0 {
			break
		}
		if round == 20 {
			t.Fatalf("%d actions still unfinished after %d rounds of Resume", left, round)
		}
		time.Sleep(400 * time.Millisecond) // leases of the machines' cut requests end
	}
	for i := range orders {
		order := fmt.Sprintf("order-%d", i)
		charged, keys := srv.ledger(order)
		if len(charged) > 1 || keys > 1 {
			t.Errorf("%s: charged %d times under %v, %d keys seen", order, len(charged), charged, keys)
		}
	}
	rows := rowsOf(t, setup, table)
	for _, r := range rows {
		charged, _ := srv.ledger(strings.TrimPrefix(r.id, "pay:"))
		if r.state != journal.StateDone && len(charged) > 0 {
			t.Errorf("%+v: not done, and charged under %v", r, charged)
		}
		if len(charged) > 0 && charged[0] != r.key {
			t.Errorf("%+v: charged under %v", r, charged)
		}
	}
	var kinds []string
	errs.Range(func(k, v any) bool {
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("%d orders, %d records, %d reported paid during the faults; answers %v", orders, len(rows), len(paidWith), kinds)
}
