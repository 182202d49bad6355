package sqljournal_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// The Transport over a PostgreSQL journal, against a loopback payment
// server: machines sharing one table charge once, a machine waits for
// another's lease, and what a lost or failing lease does.

// chargeServer is the shared payment server (internal/paytest: Stripe's
// idempotency semantics and a ledger) on loopback: the first request under
// a key performs the charge and stores its answer; a request under a key
// whose first request is still being processed gets 409; a request under
// a finished key with the same method, path and body gets the stored
// answer again, marked Idempotent-Replayed: true (with another, 422).
// Requests without a key are refused (400). A charge answers 200
// {"charge":"ch_N","key":"..."}.
type chargeServer struct {
	*httptest.Server
	pay *paytest.Server
	// before, if set, may answer a keyed request itself (and return true)
	// before the idempotency layer sees it.
	before func(w http.ResponseWriter, r *http.Request) bool
	// process, if set, runs while the charge numbered n (from 1, over all
	// keys, in the order begun), r's, is in progress: after it is
	// committed, before it is stored and answered. It may block, to play a
	// slow charge.
	process func(n int, r *http.Request)
	// answered, if set, is told the status of each request the
	// idempotency layer answers, as it decides it (a charge's 200 before
	// the charge).
	answered func(r *http.Request, status int)
	// dropAnswers plays a lost response: every charge is committed and
	// stored, and then its connection is cut without an answer.
	dropAnswers bool
	t           *testing.T

	mu      sync.Mutex
	charges int             // charges begun
	busy    map[string]bool // key (as sent) -> its charge in progress
}

func newChargeServer(t *testing.T) *chargeServer {
	s := newUnstartedChargeServer(t)
	s.Start()
	return s
}

// newUnstartedChargeServer is newChargeServer for a caller that sets hooks
// before it calls Start: a request from a child process is not ordered
// after them by anything the race detector sees.
func newUnstartedChargeServer(t *testing.T) *chargeServer {
	s := &chargeServer{t: t, busy: map[string]bool{}}
	s.pay = paytest.New(
		paytest.WithMethods(http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
			http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace),
		paytest.WithStatus(http.StatusOK),
		paytest.WithAnswerBody(chargeAnswer),
		paytest.WithBefore(func(_ int, w http.ResponseWriter, r *http.Request) bool {
			if r.Header.Get(paytest.KeyHeader) == "" || s.before == nil {
				return false
			}
			sw := statusOf(r)
			sw.told = true // what the hook answers is not the idempotency layer's
			if s.before(w, r) {
				return true
			}
			sw.told = false
			return false
		}),
		paytest.WithProcessing(func(_ int, r *http.Request) {
			key := r.Header.Get(paytest.KeyHeader)
			s.mu.Lock()
			s.charges++
			n := s.charges
			s.busy[key] = true
			s.mu.Unlock()
			s.answer(r, http.StatusOK)
			statusOf(r).told = true
			if s.process != nil {
				s.process(n, r)
			}
			s.mu.Lock()
			delete(s.busy, key)
			s.mu.Unlock()
		}),
		paytest.WithAfterCharge(func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			if !s.dropAnswers {
				return false
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				s.t.Errorf("hijack: %v", err)
				return true
			}
			conn.Close()
			return true
		}))
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), statusWriterKey{}, sw))
		sw.tell = func(status int) { s.answer(r, status) }
		s.pay.ServeHTTP(sw, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// chargeAnswer is the body of charge c's answer.
func chargeAnswer(c paytest.Charge) []byte {
	return fmt.Appendf(nil, `{"charge":%q,"key":%q}`, c.ID, c.Header.Get(paytest.KeyHeader))
}

// statusWriter tells the chargeServer's answered hook the status of an
// answer the idempotency layer writes, unless it was told already.
type statusWriter struct {
	http.ResponseWriter
	told bool
	tell func(status int)
}

type statusWriterKey struct{}

func statusOf(r *http.Request) *statusWriter {
	return r.Context().Value(statusWriterKey{}).(*statusWriter)
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.told {
		w.told = true
		w.tell(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.told {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (s *chargeServer) answer(r *http.Request, status int) {
	if s.answered != nil {
		s.answered(r, status)
	}
}

// chargeCount returns how many charges the server began.
func (s *chargeServer) chargeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges
}

// keysOf returns the keys body arrived under, in order (but for the
// requests a before hook answered).
func (s *chargeServer) keysOf(body string) []string {
	var keys []string
	for _, r := range s.pay.Requests() {
		if key := r.Header.Get(paytest.KeyHeader); key != "" && string(r.Body) == body && r.Outcome != paytest.Answered {
			keys = append(keys, key)
		}
	}
	return keys
}

// claimed reports whether a charge under key began (in progress or done).
func (s *chargeServer) claimed(key string) bool {
	s.mu.Lock()
	busy := s.busy[key]
	s.mu.Unlock()
	return busy || len(s.pay.ChargesUnder(key)) > 0
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

// machine is one backend of the fleet: its own pool, journal and HTTP
// connections; only the database is shared.
func machine(t *testing.T, table string) *idemretry.Transport {
	t.Helper()
	return transportOn(t, openOn(t, testDB(t), table), idemretry.WithMaxRetries(10),
		idemretry.WithBackOff(func() backoff.BackOff {
			return idemretry.NewFullJitter(time.Millisecond, 20*time.Millisecond, nil)
		}))
}

// pay sends order as the payment action "pay:"+order through machine m and
// returns the answer's body, failing t on anything but a 200.
func pay(t *testing.T, m *idemretry.Transport, url, order string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := post(ctx, m, url, "pay:"+order, order)
	if p.err != nil || p.status != http.StatusOK {
		t.Errorf("pay %s: %d %q %v", order, p.status, p.body, p.err)
		return ""
	}
	return p.body
}

// Two machines send the same payment action, one after the other and then
// both at once, through a server that loses the first answer: the server
// sees one key per action and charges once.
func TestTwoMachinesOneCharge(t *testing.T) {
	srv := newChargeServer(t)
	srv.dropAnswers = true
	probe := testDB(t)
	table := newTable(t, probe)
	a, b := machine(t, table), machine(t, table)

	// One after the other: B finds A's done record and replays its answer.
	first := pay(t, a, srv.URL, "order-1")
	if again := pay(t, b, srv.URL, "order-1"); again != first || first == "" {
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
			answers <- pay(t, c, srv.URL, "order-2")
		}()
	}
	wg.Wait()
	close(answers)
	var second string
	for ans := range answers {
		if second == "" {
			second = ans
		}
		if ans != second || ans == first {
			t.Errorf("concurrent payment answered %q (another %q; order-1 %q): want one stored answer of its own", ans, second, first)
		}
	}

	if n := srv.chargeCount(); n != 2 {
		t.Errorf("%d charges for two orders, want one each", n)
	}
	for _, order := range []string{"order-1", "order-2"} {
		seen := map[string]int{} // key -> requests under it
		for _, k := range srv.keysOf(order) {
			seen[k]++
		}
		if len(seen) != 1 {
			t.Errorf("%s arrived under %d keys %v, want one", order, len(seen), seen)
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
		if seen[stored] == 0 {
			t.Errorf("%s: journal key %s never reached the server (saw %v)", order, stored, seen)
		}
		if order == "order-1" && seen[stored] < 3 {
			t.Errorf("order-1 reached the server %d times, want the dropped attempt, its retry and machine B's", seen[stored])
		}
	}
}

// as sends through rt as machine name (see fleetServer).
func as(name string, rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set(machineHeader, name)
		return rt.RoundTrip(r)
	})
}

// A machine that finds the action leased by another one waits for it,
// sending nothing; when its context ends first it gets ErrLeaseHeld, with
// the action's key, and the action stays as it was.
func TestLeaseHeldUntilContextEnds(t *testing.T) {
	probe := testDB(t)
	table := newTable(t, probe)
	srv := newFleetServer(t, 0)
	a := transportOn(t, openOn(t, testDB(t), table))
	b := transportOn(t, openOn(t, testDB(t), table))

	resA := make(chan payment, 1)
	go func() { resA <- post(context.Background(), as("A", a), srv.URL, fleetAction, fleetBody) }()
	select {
	case <-srv.charged:
	case <-time.After(30 * time.Second):
		t.Fatal("A's request never reached the server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	pb := post(ctx, as("B", b), srv.URL, fleetAction, fleetBody)
	cancel()
	var ae *idemretry.ActionError
	if !errors.As(pb.err, &ae) || !errors.Is(pb.err, idemretry.ErrLeaseHeld) || !errors.Is(pb.err, context.DeadlineExceeded) {
		t.Fatalf("B: %+v, want an *ActionError with ErrLeaseHeld and the deadline", pb)
	}
	t.Logf("B: %v", pb.err)
	rows := rowsOf(t, probe, table)
	if len(rows) != 1 || ae.Key != rows[0].key || !ae.MaybeProcessed || ae.Action != fleetAction {
		t.Errorf("B's error %+v, journal %+v: want the action's key, MaybeProcessed", ae, rows)
	}
	if n := len(srv.requestsOf("B")); n != 0 {
		t.Errorf("B sent %d requests while A held the lease", n)
	}
	srv.finish()
	if pa := <-resA; pa.status != http.StatusOK || pa.replay {
		t.Fatalf("A: %+v", pa)
	}
	// B again, with time: the lease is free, the action done; the server
	// replays its answer under the same key.
	if pb := post(context.Background(), as("B", b), srv.URL, fleetAction, fleetBody); pb.status != http.StatusOK || !pb.replay {
		t.Fatalf("B after A: %+v, want the replay", pb)
	}
	if charges, conflicts, keys, _ := srv.tally(); charges != 1 || conflicts != 0 || len(keys) != 1 {
		t.Errorf("%d charges, %d 409s, keys %v; want one charge, none, one key", charges, conflicts, keys)
	}
	if h := leaseAfterRelease(t, probe, table, fleetAction); h != "" {
		t.Errorf("lease held by %q a release bound after every RoundTrip returned", h)
	}
	noKeepers(t)
}

// noKeepers fails t if a lease is still being renewed (within 2 s) once
// every RoundTrip has returned.
func noKeepers(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		if !strings.Contains(string(buf), "idemretry.(*Transport).keepLease") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a lease is still renewed after its RoundTrip returned:\n%s", buf)
		}
	}
}

// A holder whose lease was taken over (here by a statement setting
// another holder, as a machine taking over after the holder's renewals
// failed for a TTL would) stops before its next attempt with ErrLeaseLost,
// leaves the action pending with its key, and does not release the new
// holder's lease.
func TestLeaseLostStopsRetries(t *testing.T) {
	probe := testDB(t)
	table := newTable(t, probe)
	srv := newFleetServer(t, 1) // the first attempt fails: a retry follows
	waiting := make(chan struct{})
	var once sync.Once
	tr := transportOn(t, openOn(t, testDB(t), table), idemretry.WithLeaseTTL(300*time.Millisecond),
		idemretry.WithBackOff(func() backoff.BackOff { return backoff.NewConstantBackOff(2 * time.Second) }),
		idemretry.WithObserver(func(ev idemretry.Event) {
			if ev.Kind == idemretry.EventRetry {
				once.Do(func() { close(waiting) })
			}
		}))

	res := make(chan payment, 1)
	go func() { res <- post(context.Background(), as("A", tr), srv.URL, fleetAction, fleetBody) }()
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("no retry")
	}
	if _, err := probe.Exec(`UPDATE "`+table+`" SET lease_holder = 'machine-x', lease_until = now() + interval '1 hour' WHERE action_id = $1`,
		fleetAction); err != nil {
		t.Fatal(err)
	}
	p := <-res
	var ae *idemretry.ActionError
	if !errors.As(p.err, &ae) || !errors.Is(p.err, idemretry.ErrLeaseLost) || ae.Attempts != 1 {
		t.Fatalf("A: %+v, want an *ActionError with ErrLeaseLost after 1 attempt", p)
	}
	t.Logf("A: %v", p.err)
	rows := rowsOf(t, probe, table)
	if len(rows) != 1 || rows[0].state != journal.StatePending || rows[0].key != ae.Key {
		t.Errorf("journal %+v, want the action pending under %s", rows, ae.Key)
	}
	if n := len(srv.requestsOf("A")); n != 1 {
		t.Errorf("A sent %d requests, want 1", n)
	}
	if h, _ := leaseOf(t, probe, table, fleetAction); h != "machine-x" {
		t.Errorf("lease held by %q after A stopped, want machine-x's kept", h)
	}
	noKeepers(t)
}

// The lease is for load, not safety: a Lease that fails (here it waits for
// a row lock held elsewhere past the journal timeout) is logged, and the
// action is sent without a lease, with its key.
func TestLeaseFailureSendsWithoutLease(t *testing.T) {
	probe := testDB(t)
	table := newTable(t, probe)
	srv := newFleetServer(t, 1)
	j := openOn(t, testDB(t), table)
	// The action exists (pending) before its row is locked.
	seedPending(t, table, srv.URL)
	srv.finish()
	var logs bytes.Buffer
	var mu sync.Mutex
	tr := transportOn(t, j, idemretry.WithJournalTimeout(300*time.Millisecond),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	holder, err := holdLock(probe, lockRows(table))
	if err != nil {
		t.Fatal(err)
	}
	p := post(context.Background(), as("A", tr), srv.URL, fleetAction, fleetBody)
	holder.Rollback()
	if p.err != nil || p.status != http.StatusOK {
		t.Fatalf("payment with the lease failing: %+v, want it sent and answered", p)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "without a lease") {
		t.Errorf("log %q: want the failed lease said", logs.String())
	}
	if charges, _, keys, _ := srv.tally(); charges != 1 || len(keys) != 1 {
		t.Errorf("%d charges under keys %v, want one under the action's key", charges, keys)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A request whose context is context.Background's gets the journal
// timeout's shared bound (one timer for the calls that start within a
// hundredth of it). Over PostgreSQL, through database/sql and pgx (which
// derive contexts of their own from it): a Reserve that waits for a table
// lock held elsewhere ends by the journal timeout with
// journal.ErrUnavailable and nothing sent; an outcome write that waits for
// a row lock is cut by it, the answer is returned all the same, and the
// outcome, kept in memory, lands at Close.
func TestSharedBoundOverPostgres(t *testing.T) {
	probe := testDB(t)
	table := newTable(t, probe)
	j := openOn(t, testDB(t), table)
	const timeout = 300 * time.Millisecond
	tr := transportOn(t, j, idemretry.WithJournalTimeout(timeout))

	var charges atomic.Int32
	var lockOnCharge atomic.Bool
	holders := make(chan *sql.Tx, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "" {
			http.Error(w, "no key", http.StatusBadRequest)
			return
		}
		charges.Add(1)
		if lockOnCharge.Load() {
			// The charge is done; the journal's row is locked elsewhere
			// before the answer leaves, so that the outcome write waits.
			holder, err := holdLock(probe, lockRows(table))
			if err != nil {
				t.Errorf("lock rows: %v", err)
			} else {
				holders <- holder
			}
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"ch_1"}`))
	}))
	t.Cleanup(srv.Close)

	// A Reserve under a table lock.
	holder, err := holdLock(probe, lockTable(table))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := post(context.Background(), tr, srv.URL, "pay:locked", `{"amount":1}`)
	took := time.Since(start)
	holder.Rollback()
	if !errors.Is(p.err, journal.ErrUnavailable) {
		t.Errorf("Reserve under a table lock: %+v, want journal.ErrUnavailable", p)
	}
	if took > 10*time.Second {
		t.Errorf("Reserve under a table lock took %v with a journal timeout of %v", took, timeout)
	}
	if n := charges.Load(); n != 0 {
		t.Fatalf("%d charges sent although the key was not reserved", n)
	}

	// An outcome write under a row lock.
	lockOnCharge.Store(true)
	start = time.Now()
	p = post(context.Background(), tr, srv.URL, "pay:outcome", `{"amount":2}`)
	took = time.Since(start)
	lockOnCharge.Store(false)
	if p.err != nil || p.status != http.StatusCreated {
		t.Fatalf("payment whose outcome write waits for a row lock: %+v, want its answer", p)
	}
	if took > 10*time.Second {
		t.Errorf("the outcome write under a row lock held RoundTrip %v with a journal timeout of %v", took, timeout)
	}
	// The statements cut (the outcome's write, and the lease's release
	// after RoundTrip returned) end at the server too before the lock
	// does: pgx cancels them as it returns, but the server may see the
	// cancel later, and a write still queued for the lock would then
	// commit (as a lost answer can; see Journal).
	noLockWaiter(t, probe, table)
	(<-holders).Rollback()
	for _, r := range rowsOf(t, probe, table) {
		if r.id == "pay:outcome" && r.state != journal.StatePending {
			t.Fatalf("the outcome write went through a row lock: %+v", r)
		}
	}
	// Close lands the outcome kept in memory.
	if err := tr.Close(); err != nil {
		t.Errorf("Close: %v, want the kept outcome landed", err)
	}
	var state journal.State
	for _, r := range rowsOf(t, probe, table) {
		if r.id == "pay:outcome" {
			state = r.state
		}
	}
	if state != journal.StateDone {
		t.Errorf("pay:outcome is %v in the journal after Close, want done", state)
	}
	if n := charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

// A key's form is the fleet's: machine A sends a payment under a key it
// mints bare and loses the answer; machine B, set to quote the keys it
// mints (WithQuotedKey, or an upgrade that switched it), sends the action
// again in the form A first sent it, so the server sees one key and replays
// (issue 29, item 6).
func TestKeyFormAcrossMachines(t *testing.T) {
	srv := newChargeServer(t)
	srv.dropAnswers = true
	table := newTable(t, testDB(t))
	a := transportOn(t, openOn(t, testDB(t), table), idemretry.WithMaxRetries(0))
	if p := post(context.Background(), a, srv.URL, "pay:form", "form"); p.err == nil {
		t.Fatalf("A: the answer was not lost: %d %q", p.status, p.body)
	}
	// The server answers a stored key's replay before it would drop an
	// answer: B's resend under A's key is answered.
	b := transportOn(t, openOn(t, testDB(t), table), idemretry.WithQuotedKey())
	p := post(context.Background(), b, srv.URL, "pay:form", "form")
	if p.err != nil || p.status != http.StatusOK || !p.replay {
		t.Fatalf("B: %d %q replay %v %v, want the replay of A's charge", p.status, p.body, p.replay, p.err)
	}
	keys := srv.keysOf("form")
	if len(keys) != 2 || keys[0] != keys[1] || strings.HasPrefix(keys[0], `"`) {
		t.Errorf("keys as sent %q: want A's bare key twice", keys)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}
