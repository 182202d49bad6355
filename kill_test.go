package idemretry_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/internal/childtest"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// Processes killed with SIGKILL in the middle of a payment (the test
// binary run again as a child): what the journal holds after, and what a
// restarted process resends, taps again or resumes.

const (
	envE2EChild = "IDEMRETRY_E2E_CHILD" // the journal directory
	envE2EURL   = "IDEMRETRY_E2E_URL"
)

// TestJournalE2EChild is the child of TestJournalSurvivesKill: it pays one
// order through a default-style Client whose journal is in the given
// directory, and prints the response's status. It does nothing in a normal
// run.
func TestJournalE2EChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestJournalSurvivesKill")
	}
	dir := os.Getenv(envE2EChild)
	c, err := idemretry.NewClient(idemretry.WithJournalDir(dir))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	ctx := idemretry.WithAction(context.Background(), "pay:order-A-1001")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv(envE2EURL)+"/charges", strings.NewReader(`{"amount":1000}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(4)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode)
	_ = c.Close()
	os.Exit(0)
}

// The end-to-end test of issue 3: a process is killed (SIGKILL) while its
// payment is in flight, after the server committed the charge but before the
// answer came back. The restarted process resends; the server sees the same
// Idempotency-Key and charges once.
func TestJournalSurvivesKill(t *testing.T) {
	t.Parallel()
	committed := make(chan struct{}, 1)
	pay := paytest.New(paytest.WithStatus(http.StatusOK), paytest.WithAfterCharge(func(_ int, _ http.ResponseWriter, r *http.Request) bool {
		// Drop the answer: hold it until the client is gone.
		committed <- struct{}{}
		<-r.Context().Done()
		return true
	}))
	srv := newServer(t, pay.ServeHTTP) // a repeat gets the stored answer, 200, replayed
	dir := t.TempDir()

	run := func() (*exec.Cmd, *bufio.Reader) {
		cmd, out := childtest.Start(t, "TestJournalE2EChild", envE2EChild+"="+dir, envE2EURL+"="+srv.URL)
		return cmd, bufio.NewReader(out)
	}

	cmd, _ := run()
	select {
	case <-committed:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the first attempt never reached the server")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	cmd, out := run()
	line, _ := out.ReadString('\n')
	_ = cmd.Wait()
	assert.Equal(t, "status 200\n", line)

	var keys []string
	for _, r := range pay.Requests() {
		keys = append(keys, r.Header.Get(paytest.KeyHeader))
	}
	require.Len(t, keys, 2)
	assert.NotEmpty(t, keys[0])
	assert.Equal(t, keys[0], keys[1], "the restarted process used another key")
	charges := chargesPerKey(pay.Charges())
	assert.Len(t, charges, 1)
	assert.Equal(t, 1, charges[keys[0]], "charged more than once")
}

// Issue 30, item 6: a process killed (SIGKILL) during its payment's first
// attempt, after the server charged it, left a record that Unfinished
// listed with 0 attempts, which reads as "nothing sent". The first attempt
// is counted when the key is reserved, durably, before it leaves.
func TestUnfinishedCountsTheFirstAttemptAfterAKill(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	committed := make(chan struct{}, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		committed <- struct{}{} // charged; the answer never leaves
		<-r.Context().Done()
	})
	dir := t.TempDir()
	cmd := childtest.Command("TestJournalE2EChild", envE2EChild+"="+dir, envE2EURL+"="+srv.URL)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	select {
	case <-committed:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the first attempt never reached the server")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	defer j.Close()
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "pay:order-A-1001", recs[0].ActionID)
	assert.Equal(t, journal.StatePending, recs[0].State)
	assert.GreaterOrEqual(t, recs[0].Attempts, 1, "a charged payment listed as never attempted")
}

// The kill loop for Resume: an app, a real child process over the default
// file journal, resumes what its previous run left unfinished while it
// takes new payments and repeats of earlier ones, and is killed with
// SIGKILL at random moments (after a random delay, right after the server
// committed one of its charges, or while Resume runs), round after round
// over the same journal directory. The server is a loopback payment server
// with Stripe's semantics and faults (answers lost after the charge
// committed, charges slower than the client's timeout, fast 503s). The
// invariants are checked from the server's own ledger at the end, after a
// last run that resumes everything with nothing killed.

const (
	// IDEMRETRY_RESUME_KILL_ROUNDS sets the rounds of TestResumeKillLoop;
	// IDEMRETRY_RESUME_KILL_SEED its seed (printed on failure).
	envRKRounds = "IDEMRETRY_RESUME_KILL_ROUNDS"
	envRKSeed   = "IDEMRETRY_RESUME_KILL_SEED"

	// The child's environment.
	envRKDir     = "IDEMRETRY_RK_DIR" // the journal directory; set only in the child
	envRKURL     = "IDEMRETRY_RK_URL"
	envRKChild   = "IDEMRETRY_RK_SEED_CHILD"
	envRKNext    = "IDEMRETRY_RK_NEXT"    // the first new order's number
	envRKNew     = "IDEMRETRY_RK_NEW"     // how many new orders
	envRKRepeat  = "IDEMRETRY_RK_REPEAT"  // named orders to pay again
	envRKUTap    = "IDEMRETRY_RK_UTAP"    // unnamed orders to pay again
	envRKUnnamed = "IDEMRETRY_RK_UNNAMED" // every unnamed order started so far
	envRKFinal   = "IDEMRETRY_RK_FINAL"   // resume to the end, no traffic
	envRKHashed  = "IDEMRETRY_RK_HASHED"  // the journal keeps hashed ids

	// Small windows, so that the outcome-unknown path and Resolve run
	// within the test: a key may be sent for 0.7 s, and Resolve is called
	// 0.3 s after that. The ledger counts a charge from the moment the
	// server starts it, so the settle time need only cover a request's
	// way over loopback.
	rkWindow = 700 * time.Millisecond
	rkSettle = 300 * time.Millisecond
	// rkAttemptTimeout is the client's timeout per attempt: slower charges
	// are retried under their key (and answered 409 while in flight).
	rkAttemptTimeout = 250 * time.Millisecond
)

// rkBody is the request body of order n; an unnamed order's body says so,
// so that the server can hold it a little (see rkLedger.ServeHTTP).
func rkBody(n int, unnamed bool) string {
	if unnamed {
		return fmt.Sprintf(`{"order":%d,"unnamed":true}`, n)
	}
	return fmt.Sprintf(`{"order":%d}`, n)
}

// rkFingerprint is the fingerprint the Transport gives an unnamed POST of
// body to url (method, URL and the body's SHA-256): how the app tells which
// of its unnamed orders a listed "fp:" action is.
func rkFingerprint(url, body string) journal.Fingerprint {
	bh := sha256.Sum256([]byte(body))
	b := append([]byte(http.MethodPost+"\x00"+url+"\x00"), bh[:]...)
	return sha256.Sum256(b)
}

// ---- the server and its ledger ----

// rkKey is what the ledger knows of one Idempotency-Key.
type rkKey struct {
	order    int
	arrivals int
	charged  bool // processing began: the charge will be made
	chargeID string
	inflight bool
	stored   bool
	// when is the round of each arrival: "r3" while round 3's app ran,
	// "r3+" after it ended (a request of a killed app still on its way).
	when []string
}

// rkLedger is the payment server: a key is charged once and its answer
// replayed; 409 while its charge is in flight; 422 for another order under
// a key. Faults, drawn per request: a fast 503 before anything is done, a
// stall before the charge (the request is dropped uncharged if its client
// is gone by then), a charge slower than the client's timeout, the answer
// dropped after the charge committed. armKill makes it tell the parent right after a
// commit, holding the answer back.
type rkLedger struct {
	mu      sync.Mutex
	rng     *rand.Rand
	keys    map[string]*rkKey
	charges map[int][]string // order -> keys it was charged under
	chargeN int
	bad     []string // what no request may cause: keyless POSTs, 422s

	round int  // the round whose app runs, or last ran
	ended bool // that round's app has ended

	killAfter int // commits this round before killCh is signalled; 0: off
	commits   int
	killCh    chan struct{}
}

func newRKLedger(seed int64) *rkLedger {
	return &rkLedger{rng: rand.New(rand.NewPCG(uint64(seed), 1)), keys: map[string]*rkKey{}, charges: map[int][]string{}}
}

func (l *rkLedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/ledger" {
		l.mu.Lock()
		k := l.keys[r.URL.Query().Get("key")]
		charged := k != nil && k.charged
		l.mu.Unlock()
		fmt.Fprintf(w, `{"charged":%t}`, charged)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var in struct {
		Order   int  `json:"order"`
		Unnamed bool `json:"unnamed"`
	}
	if json.Unmarshal(body, &in) != nil || in.Order == 0 {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	if key == "" {
		l.bad = append(l.bad, fmt.Sprintf("order %d: a POST without a key", in.Order))
		l.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	k := l.keys[key]
	if k == nil {
		k = &rkKey{order: in.Order}
		l.keys[key] = k
	}
	k.arrivals++
	when := fmt.Sprintf("r%d", l.round)
	if l.ended {
		when += "+"
	}
	k.when = append(k.when, when)
	roll := l.rng.Float64()
	switch {
	case k.order != in.Order:
		l.bad = append(l.bad, fmt.Sprintf("key %s: order %d, then order %d", key, k.order, in.Order))
		l.mu.Unlock()
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, `{"title":"Idempotency-Key is already used"}`)
		return
	case roll < 0.08: // overloaded: nothing done
		l.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case k.stored:
		a := fmt.Sprintf(`{"charge":%q,"order":%d}`, k.chargeID, k.order)
		l.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, a)
		return
	case k.inflight:
		l.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return
	case roll < 0.16:
		// Stalled before the charge (a queue in front of it): a request
		// whose client is gone by then is dropped, not charged.
		stall := 100*time.Millisecond + time.Duration(l.rng.IntN(300))*time.Millisecond
		l.mu.Unlock()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(stall):
		}
		l.mu.Lock()
		if k.stored || k.inflight {
			l.mu.Unlock()
			w.WriteHeader(http.StatusConflict)
			return
		}
	}
	l.chargeN++
	k.charged, k.inflight, k.chargeID = true, true, fmt.Sprintf("ch_%d", l.chargeN)
	l.charges[in.Order] = append(l.charges[in.Order], key)
	delay := time.Duration(l.rng.IntN(20)) * time.Millisecond
	switch {
	case roll < 0.3: // slower than the client's timeout
		delay = 300*time.Millisecond + time.Duration(l.rng.IntN(400))*time.Millisecond
	case in.Unnamed: // long enough for a double tap to join the first
		delay = 150 * time.Millisecond
	}
	drop := l.rng.Float64() < 0.12
	l.mu.Unlock()

	time.Sleep(delay)

	l.mu.Lock()
	k.inflight, k.stored = false, true
	l.commits++
	kill := l.killCh != nil && l.commits == l.killAfter
	ch := l.killCh
	a := fmt.Sprintf(`{"charge":%q,"order":%d}`, k.chargeID, k.order)
	l.mu.Unlock()
	if kill {
		// Committed: the parent kills the app before the answer leaves.
		ch <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		hijackAndClose(w)
		return
	}
	if drop {
		hijackAndClose(w)
		return
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, a)
}

// armKill makes the server signal the channel it returns right after the
// n-th charge it commits from now on.
func (l *rkLedger) armKill(n int) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.commits, l.killAfter, l.killCh = 0, n, make(chan struct{}, 1)
	return l.killCh
}

func (l *rkLedger) disarm() {
	l.mu.Lock()
	l.killCh = nil
	l.mu.Unlock()
}

// setRound tells the ledger which round's app runs (ended false) or has
// just ended (true), for the arrivals' notes.
func (l *rkLedger) setRound(round int, ended bool) {
	l.mu.Lock()
	l.round, l.ended = round, ended
	l.mu.Unlock()
}

// arrivals is how many requests of order n reached the server.
func (l *rkLedger) arrivals(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := 0
	for _, k := range l.keys {
		if k.order == n {
			c += k.arrivals
		}
	}
	return c
}

// ---- the child: the app ----

// rkApp is the app in the child: its Resumer rebuilds an order's request
// from the action id (named) or from the fingerprint of one of its unnamed
// orders, and its Resolve asks the server's ledger about the key.
type rkApp struct {
	url   string
	final bool
	say   func(format string, a ...any)

	mu         sync.Mutex
	rng        *rand.Rand
	next       int          // the orders are 1 to next-1
	unnamed    map[int]bool // the orders paid without a name
	paid       map[int]bool // resolved as charged: not paid again
	inProgress map[int]int  // payments of the order being sent now
}

// orderOf is the order rec is an action of: by its id, "order:N", or,
// for an unnamed order or an id the journal lists as a digest
// (filejournal.WithHashedIDs), by the fingerprint of one of the app's
// orders.
func (a *rkApp) orderOf(rec journal.Record) (int, bool) {
	if s, ok := strings.CutPrefix(rec.ActionID, "order:"); ok {
		n, err := strconv.Atoi(s)
		return n, err == nil
	}
	if !strings.HasPrefix(rec.ActionID, "fp:") && !journal.IsDigest(rec.ActionID) {
		return 0, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for n := 1; n < a.next; n++ {
		if rkFingerprint(a.url+"/charge", rkBody(n, a.unnamed[n])) == rec.Fingerprint {
			return n, true
		}
	}
	return 0, false
}

func (a *rkApp) isUnnamed(n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unnamed[n]
}

func (a *rkApp) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	n, ok := a.orderOf(rec)
	if !ok {
		a.say("rebuild-miss %s", rec.ActionID)
		return nil, nil
	}
	a.say("rebuild %d", n)
	return http.NewRequestWithContext(ctx, http.MethodPost, a.url+"/charge", strings.NewReader(rkBody(n, a.isUnnamed(n))))
}

func (a *rkApp) Resolve(ctx context.Context, rec journal.Record) (bool, error) {
	n, ok := a.orderOf(rec)
	if !ok {
		a.say("resolve-miss %s", rec.ActionID)
		return false, errors.New("unknown order")
	}
	a.mu.Lock()
	fail := !a.final && a.rng.Float64() < 0.1
	a.mu.Unlock()
	if fail {
		a.say("resolve %d %s error", n, rec.Key)
		return false, errors.New("the provider did not answer")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, a.url+"/ledger?key="+rec.Key, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.say("resolve %d %s error", n, rec.Key)
		return false, err
	}
	var out struct{ Charged bool }
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil {
		a.say("resolve %d %s error", n, rec.Key)
		return false, err
	}
	if !out.Charged {
		a.say("resolve %d %s notcharged", n, rec.Key)
		return true, nil
	}
	// Paid: the app records it and pays it no more; it forgets the action
	// only when no payment of it is being sent, which could otherwise go
	// out under a new key once the action is forgotten.
	a.mu.Lock()
	a.paid[n] = true
	busy := a.inProgress[n] > 0
	a.mu.Unlock()
	a.say("resolve %d %s charged", n, rec.Key)
	return !busy, nil
}

// pay sends order n once, as a tap on Pay, unless the app knows it paid.
func (a *rkApp) pay(tr *idemretry.Transport, n int, unnamed bool, kind string) {
	a.mu.Lock()
	if a.paid[n] {
		a.mu.Unlock()
		return
	}
	a.inProgress[n]++
	if unnamed {
		a.unnamed[n] = true
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inProgress[n]--
		a.mu.Unlock()
	}()
	a.say("start %d %s %t", n, kind, unnamed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !unnamed {
		ctx = idemretry.WithAction(ctx, "order:"+strconv.Itoa(n))
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.url+"/charge", strings.NewReader(rkBody(n, unnamed)))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		a.say("fail %d %s", n, rkErrClass(err))
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 || idemretry.GiveUpReason(resp) != nil {
		a.say("status %d %d", n, resp.StatusCode)
		return
	}
	var out struct{ Charge string }
	_ = json.Unmarshal(b, &out)
	a.say("ok %d %d %s", n, resp.StatusCode, out.Charge)
}

func rkErrClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, idemretry.ErrOutcomeUnknown):
		return "outcome-unknown"
	case errors.Is(err, idemretry.ErrKeyWindowExpired):
		return "window-expired"
	case errors.Is(err, idemretry.ErrNotResumable):
		return "not-resumable"
	case errors.Is(err, idemretry.ErrParked):
		return "parked"
	case errors.Is(err, idemretry.ErrAttemptsExhausted):
		return "exhausted"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, idemretry.ErrFingerprintMismatch):
		return "fingerprint-mismatch"
	}
	return "other:" + strings.Join(strings.Fields(err.Error()), "_")
}

func rkInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// TestResumeKillLoopChild is the app of TestResumeKillLoop; it does nothing
// in a normal run.
func TestResumeKillLoopChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestResumeKillLoop")
	}
	dir := os.Getenv(envRKDir)
	var outMu sync.Mutex
	say := func(format string, a ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, "rk "+format+"\n", a...) // one write each: in the pipe before any kill
	}
	seed, _ := strconv.ParseUint(os.Getenv(envRKChild), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 2))
	url := os.Getenv(envRKURL)
	final := os.Getenv(envRKFinal) != ""
	app := &rkApp{url: url, final: final, say: say, rng: rand.New(rand.NewPCG(seed, 3)),
		unnamed: map[int]bool{}, paid: map[int]bool{}, inProgress: map[int]int{}}
	for _, n := range rkInts(os.Getenv(envRKUnnamed)) {
		app.unnamed[n] = true
	}
	next, _ := strconv.Atoi(os.Getenv(envRKNext))
	count, _ := strconv.Atoi(os.Getenv(envRKNew))
	app.next = next + count
	jopts := []filejournal.Option{filejournal.WithLockWait(5 * time.Second)}
	if os.Getenv(envRKHashed) != "" {
		jopts = append(jopts, filejournal.WithHashedIDs())
	}
	base := &http.Transport{ResponseHeaderTimeout: rkAttemptTimeout}
	tr, err := idemretry.NewTransport(base,
		idemretry.WithJournalDir(dir, jopts...),
		idemretry.WithKeyWindow(rkWindow), idemretry.WithSettleTime(rkSettle),
		idemretry.WithBackOff(func() backoff.BackOff { return idemretry.NewFullJitter(40*time.Millisecond, 200*time.Millisecond, nil) }),
		idemretry.WithMaxRetries(5))
	if err != nil {
		say("open-error %s", strings.ReplaceAll(err.Error(), " ", "_"))
		os.Exit(3)
	}
	resume := func() {
		say("resume-start")
		results, err := tr.Resume(context.Background(), app, 0)
		for _, r := range results {
			n, _ := app.orderOf(r.Record)
			say("res %d %s %t %d %t %s", n, r.Record.State, r.Sent, r.Status, r.Forgotten, rkErrClass(r.Err))
		}
		say("resume-end %d %t", len(results), err == nil)
	}

	if final {
		deadline := time.Now().Add(4 * (rkWindow + rkSettle))
		for {
			resume()
			un, err := tr.Journal().Unfinished(context.Background())
			if err != nil {
				say("final-error %s", strings.ReplaceAll(err.Error(), " ", "_"))
				os.Exit(4)
			}
			if len(un) == 0 || time.Now().After(deadline) {
				say("final-left %d", len(un))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		say("final-close %t", tr.Close() == nil)
		os.Exit(0)
	}

	// Resume, at start-up, while the app takes payments.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resume()
	}()
	type op struct {
		n       int
		unnamed bool
		kind    string
		taps    int
	}
	var ops []op
	for i := range count {
		unnamed := rng.Float64() < 0.3
		taps := 1
		if rng.Float64() < 0.3 {
			taps = 2 // a double tap
		}
		ops = append(ops, op{n: next + i, unnamed: unnamed, kind: "new", taps: taps})
	}
	for _, n := range rkInts(os.Getenv(envRKRepeat)) {
		ops = append(ops, op{n: n, kind: "repeat", taps: 1})
	}
	for _, n := range rkInts(os.Getenv(envRKUTap)) {
		ops = append(ops, op{n: n, unnamed: true, kind: "retap", taps: 1})
	}
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	for _, o := range ops {
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
		for tap := range o.taps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kind := o.kind
				if tap > 0 {
					kind = "tap2"
				}
				app.pay(tr, o.n, o.unnamed, kind)
			}()
			if o.taps > 1 && !o.unnamed {
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			}
		}
	}
	wg.Wait()
	say("close %t", tr.Close() == nil)
	say("end")
	os.Exit(0)
}

// ---- the parent ----

// rkState is what the parent learned from the app's output over all rounds:
// the app's own records (the orders it started, those it knows paid), and
// what the app was told.
type rkState struct {
	started         map[int]bool
	unnamed         map[int]bool
	toldOK          map[int][]string // order -> charge ids the app was told
	resumedOK       map[int]bool     // a Resume result with a 2xx
	resolvedCharged map[int][]string // order -> keys Resolve was told were charged
	notCharged      map[string]int   // key -> order, Resolve told not charged
	problems        []string

	resumes, resolves, rebuilds, resumeSent, resumeForgotten      int
	resumeRounds, kills, killsInResume, killsOnCommit, cleanExits int
	fails                                                         map[string]int
	finalLeft                                                     int
	finalClosed                                                   bool

	retapsHeld int              // retaps refused only because the journal held the order
	round      int              // the round whose output is applied
	orderLog   map[int][]string // order -> the app's lines about it, by round
}

// round is one child's output, as far as the parent needs it.
type rkRound struct {
	resumeStart, resumeEnd, end bool
}

func (s *rkState) apply(line string, rd *rkRound) {
	f := strings.Fields(strings.TrimPrefix(line, "rk "))
	if len(f) == 0 {
		return
	}
	num := func(i int) int {
		if i >= len(f) {
			return 0
		}
		n, _ := strconv.Atoi(f[i])
		return n
	}
	switch f[0] {
	case "start", "ok", "fail", "status", "rebuild", "resolve", "res":
		if s.orderLog == nil {
			s.orderLog = map[int][]string{}
		}
		s.orderLog[num(1)] = append(s.orderLog[num(1)], fmt.Sprintf("r%d: %s", s.round, line))
	}
	switch f[0] {
	case "start":
		s.started[num(1)] = true
		if len(f) > 3 && f[3] == "true" {
			s.unnamed[num(1)] = true
		}
	case "ok":
		s.toldOK[num(1)] = append(s.toldOK[num(1)], f[3])
	case "fail":
		s.fails[f[2]]++
	case "status":
		s.fails["status-"+f[2]]++
	case "rebuild":
		s.rebuilds++
	case "rebuild-miss", "resolve-miss", "open-error", "final-error":
		s.problems = append(s.problems, line)
	case "resolve":
		s.resolves++
		switch f[3] {
		case "charged":
			s.resolvedCharged[num(1)] = append(s.resolvedCharged[num(1)], f[2])
		case "notcharged":
			s.notCharged[f[2]] = num(1)
		}
	case "res":
		if f[3] == "true" {
			s.resumeSent++
		}
		if st := num(4); st/100 == 2 {
			s.resumedOK[num(1)] = true
		}
		if f[5] == "true" {
			s.resumeForgotten++
		}
	case "resume-start":
		rd.resumeStart = true
		s.resumes++
	case "resume-end":
		rd.resumeEnd = true
	case "end":
		rd.end = true
	case "final-left":
		s.finalLeft = num(1)
	case "final-close":
		s.finalClosed = f[1] == "true"
	}
}

// TestResumeKillLoop: rounds of an app killed with SIGKILL while Resume and
// live payments run, over one journal directory; then the server's ledger
// must show no order charged twice, nothing the app was told paid that was
// not charged, every key that reached the server either charged or
// reported not charged by Resolve, and nothing left in the journal.
func TestResumeKillLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("kill loop: child processes")
	}
	rounds := 30
	if s := os.Getenv(envRKRounds); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, envRKRounds)
		rounds = n
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv(envRKSeed); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, envRKSeed)
		seed = n
	}
	// Half the runs keep hashed action ids: Resume then lists digests.
	hashed := uint64(seed)%2 == 1
	t.Logf("seed %d, %d rounds, hashed ids %t", seed, rounds, hashed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed with seed %d: rerun with %s=%d %s=%d", seed, envRKSeed, seed, envRKRounds, rounds)
		}
	})
	goroutinesBefore := runtime.NumGoroutine()
	led := newRKLedger(seed)
	srv := httptest.NewServer(led)
	defer srv.Close()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	st := &rkState{started: map[int]bool{}, unnamed: map[int]bool{}, toldOK: map[int][]string{}, resumedOK: map[int]bool{}, orderLog: map[int][]string{},
		resolvedCharged: map[int][]string{}, notCharged: map[string]int{}, fails: map[string]int{}}
	next := 1
	start := time.Now()

	prevCommitKill := false
	runChild := func(round int, env []string, final bool) {
		if hashed {
			env = append(env, envRKHashed+"=1")
		}
		cmd := childtest.Command("TestResumeKillLoopChild", append([]string{envRKDir + "=" + dir, envRKURL + "=" + srv.URL,
			fmt.Sprintf("%s=%d", envRKChild, uint64(seed)+uint64(round)*7919)}, env...)...)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		lines := make(chan string, 256)
		var committed <-chan struct{}
		var timer <-chan time.Time
		mode := "none"
		if !final {
			// A kill right after a commit leaves that action pending: the
			// next run's Resume rebuilds it, a moment to kill it in.
			switch p := rng.Float64(); {
			case prevCommitKill && p < 0.8, !prevCommitKill && p >= 0.85:
				mode = "resume"
				st.resumeRounds++
			case p < 0.45:
				mode = "delay"
				timer = time.After(time.Duration(rng.IntN(1600)) * time.Millisecond)
			default:
				mode = "commit"
				committed = led.armKill(1 + rng.IntN(3))
			}
		}
		prevCommitKill = false
		st.round = round
		led.setRound(round, false)
		require.NoError(t, cmd.Start())
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		var rd rkRound
		killed := false
		kill := func() {
			if !killed {
				killed = true
				_ = cmd.Process.Kill()
			}
		}
		hard := time.After(60 * time.Second)
	loop:
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					break loop
				}
				if !strings.HasPrefix(line, "rk ") {
					continue
				}
				st.apply(line, &rd)
				if mode != "resume" || killed || timer != nil {
					continue
				}
				// During Resume: a moment after it starts, or after it
				// rebuilt or resolved its first action (it calls the
				// Resumer only while it runs); if it ends first, at a
				// random moment of the rest.
				switch {
				case line == "rk resume-start" && rng.IntN(2) == 0:
					timer = time.After(time.Duration(rng.IntN(40)) * time.Millisecond)
				case strings.HasPrefix(line, "rk rebuild ") || strings.HasPrefix(line, "rk resolve "):
					if rng.IntN(2) == 0 {
						kill()
						continue
					}
					timer = time.After(time.Duration(rng.IntN(20)) * time.Millisecond)
				case strings.HasPrefix(line, "rk resume-end"):
					timer = time.After(time.Duration(rng.IntN(400)) * time.Millisecond)
				}
			case <-timer:
				timer = nil
				kill()
			case <-committed:
				committed = nil
				kill()
			case <-hard:
				hard = nil
				kill()
				st.problems = append(st.problems, fmt.Sprintf("round %d: the app was still running after 60 s", round))
			}
		}
		err = cmd.Wait()
		led.setRound(round, true)
		led.disarm()
		switch {
		case killed && !rd.end:
			st.kills++
			if rd.resumeStart && !rd.resumeEnd {
				st.killsInResume++
			}
			if mode == "commit" {
				st.killsOnCommit++
				prevCommitKill = true
			}
		case err != nil:
			st.problems = append(st.problems, fmt.Sprintf("round %d: the app failed: %v\n%s", round, err, stderr.String()))
		default:
			st.cleanExits++
		}
		if strings.Contains(stderr.String(), "DATA RACE") || strings.Contains(stderr.String(), "panic:") {
			st.problems = append(st.problems, fmt.Sprintf("round %d: the app's stderr:\n%s", round, stderr.String()))
		}
	}

	ran := 0
	for round := range rounds {
		ran++
		// The app's records: the orders it started and does not know paid
		// may be paid again (the user taps Pay again); an unnamed one only
		// if no request of it ever reached the server and the journal
		// holds no record of it (after its first finished, an identical
		// unnamed request is a new payment: see rkMayRetap).
		// Mostly recent orders (within their key window the server
		// replays them), now and then an old one (refused: its window
		// ended).
		var repeat, utap, unnamed []int
		var rj *filejournal.Journal // opened by rkMayRetap, between the rounds
		scratch := ""
		for n := 1; n < next; n++ {
			switch {
			case !st.started[n]:
			case st.unnamed[n]:
				unnamed = append(unnamed, n)
				if scratch == "" {
					scratch = filepath.Join(t.TempDir(), "journal")
					require.NoError(t, os.Mkdir(scratch, 0o700))
				}
				may, err := rkMayRetap(&rj, dir, scratch, hashed, srv.URL, st, led, n)
				require.NoError(t, err)
				if !may && len(st.resolvedCharged[n]) == 0 && led.arrivals(n) == 0 {
					st.retapsHeld++ // pending in the journal, nothing arrived
				}
				if may && rng.Float64() < 0.7 {
					utap = append(utap, n)
					st.orderLog[n] = append(st.orderLog[n], fmt.Sprintf("r%d: the parent has the app tap it again (no arrivals)", round))
				}
			case len(st.resolvedCharged[n]) > 0:
			case n >= next-10 && rng.Float64() < 0.4, rng.Float64() < 0.01:
				repeat = append(repeat, n)
			}
		}
		if rj != nil {
			require.NoError(t, rj.Close())
		}
		newN := 2 + rng.IntN(5)
		runChild(round, []string{
			fmt.Sprintf("%s=%d", envRKNext, next), fmt.Sprintf("%s=%d", envRKNew, newN),
			envRKRepeat + "=" + rkJoin(repeat), envRKUTap + "=" + rkJoin(utap), envRKUnnamed + "=" + rkJoin(unnamed),
		}, false)
		next += newN
		if len(st.problems) > 0 {
			break
		}
		if rng.Float64() < 0.5 {
			// The app stays closed a while: some of its keys' windows end.
			time.Sleep(time.Duration(rng.IntN(1200)) * time.Millisecond)
		}
	}
	// The last run: Resume to the end, nothing killed, no live payments.
	var unnamed []int
	for n := range st.unnamed {
		unnamed = append(unnamed, n)
	}
	runChild(rounds, []string{envRKFinal + "=1", fmt.Sprintf("%s=%d", envRKNext, next), envRKUnnamed + "=" + rkJoin(unnamed)}, true)
	elapsed := time.Since(start)
	srv.Close()

	// The journal opens cleanly, and holds nothing unfinished.
	var jopts []filejournal.Option
	if hashed {
		jopts = append(jopts, filejournal.WithHashedIDs())
	}
	j, err := filejournal.Open(dir, jopts...)
	require.NoError(t, err, "the journal after the last run")
	rec := j.Recovery()
	ctx := context.Background()
	un, err := j.Unfinished(ctx)
	require.NoError(t, err)
	var problems []string
	problems = append(problems, st.problems...)
	if rec.TornTail || len(rec.Salvaged) > 0 || rec.Duplicates > 0 {
		problems = append(problems, fmt.Sprintf("the journal, after a clean close: %+v", rec))
	}
	if !st.finalClosed {
		problems = append(problems, "the last run's Close failed")
	}
	for _, r := range un {
		problems = append(problems, fmt.Sprintf("left unfinished after the last Resume: %s %s %s (created %s)", r.ActionID, r.Key, r.State, r.CreatedAt.Format(time.RFC3339Nano)))
	}

	// The ledger.
	led.mu.Lock()
	problems = append(problems, led.bad...)
	charged := map[int]bool{}
	for n, keys := range led.charges {
		charged[n] = true
		if len(keys) > 1 {
			var notes []string
			for _, k := range keys {
				notes = append(notes, fmt.Sprintf("%s (arrivals %d, resolved not charged: %t)", k, led.keys[k].arrivals, st.notCharged[k] == n))
			}
			for _, k := range keys {
				t.Logf("order %d: key %s arrived in rounds %v", n, k, led.keys[k].when)
			}
			t.Logf("order %d: the app's lines:\n%s", n, strings.Join(st.orderLog[n], "\n"))
			problems = append(problems, fmt.Sprintf("order %d (unnamed %t) charged %d times: %s", n, st.unnamed[n], len(keys), strings.Join(notes, ", ")))
		}
	}
	chargeOrder := map[string]int{}
	for _, k := range led.keys {
		if k.charged {
			chargeOrder[k.chargeID] = k.order
		}
	}
	for n, ids := range st.toldOK {
		for _, id := range ids {
			if chargeOrder[id] != n {
				problems = append(problems, fmt.Sprintf("order %d: the app was told it was paid (%q), the server has no such charge of it", n, id))
			}
		}
	}
	for n := range st.resumedOK {
		if !charged[n] {
			problems = append(problems, fmt.Sprintf("order %d: Resume reported it paid, the server never charged it", n))
		}
	}
	for key, n := range st.notCharged {
		if k := led.keys[key]; k != nil && k.charged {
			problems = append(problems, fmt.Sprintf("order %d: Resolve was told key %s had no charge, and the server charged it (after the settle time)", n, key))
		}
	}
	for n, keys := range st.resolvedCharged {
		for _, key := range keys {
			if k := led.keys[key]; k == nil || !k.charged || k.order != n {
				problems = append(problems, fmt.Sprintf("order %d: Resolve was told key %s was charged; the ledger disagrees", n, key))
			}
		}
	}
	arrivedKeys := 0
	for key, k := range led.keys {
		arrivedKeys++
		if !k.charged {
			if _, ok := st.notCharged[key]; !ok {
				problems = append(problems, fmt.Sprintf("order %d: key %s reached the server (%d times), was never charged, and Resume never reported it not charged", k.order, key, k.arrivals))
			}
		}
	}
	led.mu.Unlock()
	reportedNotCharged := map[int]bool{}
	for _, n := range st.notCharged {
		reportedNotCharged[n] = true
	}
	neverDurable := 0
	for n := range st.started {
		if charged[n] {
			continue
		}
		id := "order:" + strconv.Itoa(n)
		if st.unnamed[n] {
			id = "fp:" + fmt.Sprintf("%x", rkFingerprint(srv.URL+"/charge", rkBody(n, true)))
		}
		r, found, err := j.Get(ctx, id)
		require.NoError(t, err)
		switch {
		case found:
			problems = append(problems, fmt.Sprintf("order %d: never charged, and its record is %s (key %s, status %d)", n, r.State, r.Key, r.Status))
		case !reportedNotCharged[n]:
			if led.arrivals(n) > 0 {
				problems = append(problems, fmt.Sprintf("order %d: reached the server, never charged, gone from the journal, never reported", n))
			}
			neverDurable++
		}
	}
	require.NoError(t, j.Close())

	t.Logf("%d rounds in %s: %d orders (%d unnamed), %d charged; %d keys at the server; %d kills (%d during Resume, of %d rounds aiming there; %d right after a commit), %d clean exits",
		ran, elapsed.Round(time.Millisecond), len(st.started), len(st.unnamed), len(charged), arrivedKeys, st.kills, st.killsInResume, st.resumeRounds, st.killsOnCommit, st.cleanExits)
	t.Logf("%d Resumes: %d Rebuild calls, %d sent, %d Resolve calls (%d charged, %d not charged), %d forgotten; %d orders never durable; %d retaps refused for a record in the journal; live failures %v",
		st.resumes, st.rebuilds, st.resumeSent, st.resolves, rkCount(st.resolvedCharged), len(st.notCharged), st.resumeForgotten, neverDurable, st.retapsHeld, st.fails)
	if len(problems) > 0 {
		slices.Sort(problems)
		t.Fatalf("%d invariant(s) broken:\n%s", len(problems), strings.Join(problems, "\n"))
	}
	// The paths the test is about ran.
	require.Positive(t, st.rebuilds, "no Rebuild: Resume never resent anything")
	require.Positive(t, st.resumeSent, "Resume sent nothing")
	require.Positive(t, st.resolves, "no Resolve: the outcome-unknown path never ran")
	require.Positive(t, st.kills, "nothing was killed")
	if rounds >= 20 {
		require.Positive(t, st.killsInResume, "no kill during Resume")
	}

	// No goroutine of the parent's left behind.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutinesBefore && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), goroutinesBefore, "goroutines left:\n%s", goroutineStacks())
}

// rkMayRetap says whether the app may pay unnamed order n again in the
// next round, between rounds (no app runs): the user taps Pay again for a
// payment the app never saw go out. Only if it was never resolved charged,
// no request of it reached the server, and the journal holds no record of
// it. No arrival is not enough: an app killed after the key was reserved
// (durably, before anything is sent) and before its request arrived (or
// while it is still on its way) leaves the action pending; the next run's
// Resume sends it under its key, and a tap of the same unnamed payment
// that comes after Resume's flight landed is a deliberate repeat, a new key
// (README, "What an unnamed request cannot know"): a second charge that no
// Transport can tell from a wanted one. The journal is read from a copy of
// dir made in scratch (an empty directory) at the first call, *j, which the
// caller closes, so that the next app's Open meets what the killed one
// left.
func rkMayRetap(j **filejournal.Journal, dir, scratch string, hashed bool, url string, st *rkState, led *rkLedger, n int) (bool, error) {
	if len(st.resolvedCharged[n]) > 0 || led.arrivals(n) > 0 {
		return false, nil
	}
	if *j == nil {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return false, err
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			info, err := e.Info()
			if err != nil {
				return false, err
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				return false, err
			}
			if err := os.WriteFile(filepath.Join(scratch, e.Name()), b, info.Mode().Perm()); err != nil {
				return false, err
			}
		}
		var opts []filejournal.Option
		if hashed {
			opts = append(opts, filejournal.WithHashedIDs())
		}
		if *j, err = filejournal.Open(scratch, opts...); err != nil {
			return false, err
		}
	}
	id := "fp:" + fmt.Sprintf("%x", rkFingerprint(url+"/charge", rkBody(n, true)))
	_, found, err := (*j).Get(context.Background(), id)
	return !found, err
}

func rkJoin(ns []int) string {
	slices.Sort(ns)
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

func rkCount(m map[int][]string) int {
	c := 0
	for _, v := range m {
		c += len(v)
	}
	return c
}

const (
	envRetapDir = "IDEMRETRY_RETAP_DIR"
	envRetapURL = "IDEMRETRY_RETAP_URL"
)

// TestResumeKillLoopRetapChild is the app of
// TestResumeKillLoopRetapRule: it pays unnamed order 1 through a base
// transport that announces the request and never sends it, so that it is
// killed with the key durably reserved and nothing on the wire.
//
// Found in review hu1 (4b7b2ab; was TestResumeKillLoopRetapChildHU1).
func TestResumeKillLoopRetapChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestResumeKillLoopRetapRule")
	}
	dir := os.Getenv(envRetapDir)
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		fmt.Fprintf(os.Stdout, "retap sending %s\n", r.Header.Get("Idempotency-Key"))
		time.Sleep(time.Hour) // killed here
		return nil, context.Canceled
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithKeyWindow(time.Minute))
	if err != nil {
		fmt.Fprintf(os.Stdout, "retap open-error %v\n", err)
		os.Exit(3)
	}
	req, _ := http.NewRequest(http.MethodPost, os.Getenv(envRetapURL)+"/charge", strings.NewReader(rkBody(1, true)))
	_, _ = tr.RoundTrip(req)
	os.Exit(4)
}

// TestResumeKillLoopRetapRule checks the rule by which TestResumeKillLoop
// has the app tap an unnamed order again (rkMayRetap) against the case it
// must refuse: the app was killed (SIGKILL) after the order's key was
// durably reserved and before any request of it reached the server. No
// arrival at the server, nothing resolved, yet the journal holds the action
// pending: the next run's Resume sends it under its key, and a tap of the
// same unnamed payment after Resume's flight landed is, as the README says
// ("What an unnamed request cannot know"), a deliberate repeat: a new key, a
// second charge. The kill loop then reports "order N (unnamed true) charged
// 2 times" although the Transport did what it promises. Over real loopback
// HTTP, with the kill loop's own server, app and rule.
//
// Found in review hu1 (4b7b2ab; was TestResumeKillLoopRetapRuleHU1).
func TestResumeKillLoopRetapRule(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("child process")
	}
	led := newRKLedger(1)
	srv := httptest.NewServer(led)
	defer srv.Close()
	dir := t.TempDir()

	// Run 1: killed between the reserve and the send.
	cmd, out := childtest.Start(t, "TestResumeKillLoopRetapChild", envRetapDir+"="+dir, envRetapURL+"="+srv.URL)
	keyc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if k, ok := strings.CutPrefix(sc.Text(), "retap sending "); ok {
				keyc <- k
			}
		}
		close(keyc)
	}()
	var key1 string
	select {
	case key1 = <-keyc:
	case <-time.After(60 * time.Second):
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.NotEmpty(t, key1, "the child never came to send order 1")
	require.Zero(t, led.arrivals(1), "nothing of order 1 reached the server")

	// Between the runs: the kill loop's rule.
	st := &rkState{resolvedCharged: map[int][]string{}}
	var j *filejournal.Journal
	may, err := rkMayRetap(&j, dir, t.TempDir(), false, srv.URL, st, led, 1)
	require.NoError(t, err)
	if j != nil {
		require.NoError(t, j.Close())
	}

	// Run 2: Resume at start-up; the user taps Pay again, here once
	// Resume has finished (in the kill loop, whenever its op comes up).
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithKeyWindow(time.Minute),
		idemretry.WithBackOff(func() backoff.BackOff { return idemretry.NewFullJitter(40*time.Millisecond, 200*time.Millisecond, nil) }),
		idemretry.WithMaxRetries(5))
	require.NoError(t, err)
	app := &rkApp{url: srv.URL, say: t.Logf, rng: rand.New(rand.NewPCG(1, 3)), next: 2,
		unnamed: map[int]bool{1: true}, paid: map[int]bool{}, inProgress: map[int]int{}}
	results, err := tr.Resume(context.Background(), app, 0)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.Equal(t, key1, results[0].Record.Key, "Resume sends the pending action under its key")
	require.True(t, results[0].Sent)
	require.Equal(t, http.StatusCreated, results[0].Status)
	if may {
		app.pay(tr, 1, true, "retap")
	}
	require.NoError(t, tr.Close())

	led.mu.Lock()
	keys := append([]string(nil), led.charges[1]...)
	led.mu.Unlock()
	require.Len(t, keys, 1, "order 1 (unnamed true) charged %d times under %v: rkMayRetap let the app pay again an unnamed order whose pending key the next run's Resume sends", len(keys), keys)
	require.Equal(t, key1, keys[0])
}

// forgettingResumer is an app that, asked to rebuild pay:A, finds it has
// reconciled the order by itself meanwhile (cancelled it, say) and forgets
// the action, then returns its request as Rebuild must.
type forgettingResumer struct {
	j    journal.Journal
	url  string
	body string
}

func (f *forgettingResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	if err := f.j.Forget(ctx, rec.ActionID); err != nil {
		return nil, err
	}
	return http.NewRequestWithContext(ctx, http.MethodPost, f.url, stringsReader(f.body))
}

func (*forgettingResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// The app forgot pay:A (it reconciled it itself) while Resume rebuilt it.
// Resume's Reserve finds no record and re-creates the listed one, durably
// (synced, with its old key and CreatedAt). A process killed right after
// (SIGKILL, the battery, the OS reclaiming an app at start-up) must not
// leave it pending: the next start would list it and Resume send the
// forgotten key (the order the app cancelled, charged). Outcome-unknown, it
// goes to Resolve. Here the child is held at that moment by a journal that
// pauses after the Reserve (the window is otherwise a sync long) and
// killed for real.
//
// Found in review 2 of Resume (e80c783; was TestReview2ResumeCrashAfterReCreateResurrectsAForgottenAction).
func TestResumeKilledAfterReCreateLeavesTheForgottenActionUnknown(t *testing.T) {
	t.Parallel()
	const body = `{"order":"A"}`
	if childtest.IsChild() {
		resumeThenHang(t, os.Getenv("IDEMRETRY_RECREATE_DIR"), os.Getenv("IDEMRETRY_RECREATE_URL"), body)
		return
	}
	srv := newPayServer(t)
	dir := t.TempDir()
	fj, err := filejournal.Open(dir)
	require.NoError(t, err)
	listed := pendingPayA(t, srv, fj, body)
	require.NoError(t, fj.Close())

	cmd := childtest.Command("TestResumeKilledAfterReCreateLeavesTheForgottenActionUnknown", "IDEMRETRY_RECREATE_DIR="+dir, "IDEMRETRY_RECREATE_URL="+srv.URL)
	cmd.Args = append(cmd.Args, "-test.v")
	require.NoError(t, cmd.Start())
	marker := filepath.Join(dir, "..", filepath.Base(dir)+".recreated")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("the child never re-created the record")
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	after, err := filejournal.Open(dir)
	require.NoError(t, err)
	defer after.Close()
	recs, err := after.Unfinished(context.Background())
	require.NoError(t, err)
	for _, r := range recs {
		t.Logf("after the crash the journal lists %s %s key %s (listed before: key %s)", r.ActionID, r.State, r.Key, listed.Key)
		assert.NotEqual(t, journal.StatePending, r.State, "an action the app forgot is pending again after a crash, under its old key: the next Resume sends it")
	}
}

// resumeThenHang is the child: it resumes pay:A, whose Rebuild forgets it,
// and hangs once Resume's Reserve has re-created the record.
func resumeThenHang(t *testing.T, dir, url, body string) {
	fj, err := filejournal.Open(dir)
	require.NoError(t, err)
	j := &pausingJournal{Journal: fj}
	j.after = func(_, _ journal.Record, created bool) {
		if created {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "..", filepath.Base(dir)+".recreated"), nil, 0o600))
			select {} // killed here
		}
	}
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(j))
	require.NoError(t, err)
	_, _ = tr.Resume(context.Background(), &forgettingResumer{j: j, url: url, body: body}, 0)
	t.Fatal("Resume returned: no record was re-created")
}

// hW1's review: the default path (unnamed, the file journal, an
// http.Client) when the app is killed with SIGKILL after the server
// committed the charge and before the answer reached it, directly or on
// a 307's hop; then a new process on the same journal taps again, or
// resumes.

const (
	envKillDir = "IDEMRETRY_KILL_DIR"
	envKillURL = "IDEMRETRY_KILL_URL"
)

// holdingLedger is the shared payment server (internal/paytest) whose
// first charge, if committed is set, is committed and then its answer is
// held until release (the app is killed meanwhile); /redir answers 307 to
// /pay.
type holdingLedger struct {
	*paytest.Server
	mu                 sync.Mutex
	held               bool
	committed, release chan struct{}
}

func newHoldingLedger(committed, release chan struct{}) *holdingLedger {
	l := &holdingLedger{committed: committed, release: release}
	l.Server = paytest.New(
		paytest.WithBefore(func(_ int, w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/redir" {
				return false
			}
			w.Header().Set("Location", "/pay")
			w.WriteHeader(http.StatusTemporaryRedirect)
			return true
		}),
		paytest.WithAfterCharge(func(int, http.ResponseWriter, *http.Request) bool {
			l.mu.Lock()
			hold := !l.held && l.committed != nil
			l.held = true
			l.mu.Unlock()
			if hold {
				close(l.committed)
				<-l.release
			}
			return hold
		}))
	return l
}

func (l *holdingLedger) charges() int { return len(l.Charges()) }

// keys returns the keys of the requests the ledger charged or replayed
// (the 307s left out), in order.
func (l *holdingLedger) keys() []string {
	var out []string
	for _, r := range l.Requests() {
		if r.Outcome != paytest.Answered {
			out = append(out, r.Header.Get(paytest.KeyHeader))
		}
	}
	return out
}

// TestKilledUnnamedPaymentChild is the app the tests below kill: it pays one unnamed
// payment through an http.Client over the default file journal and never
// closes anything.
//
// Found in review hw1 (f949e43; was TestHW1KillChild).
func TestKilledUnnamedPaymentChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("the child process of TestKilledMidChargeThenTapOrResume and TestKilledAfterARedirectedUnnamedPaymentThenRepeat")
	}
	dir := os.Getenv(envKillDir)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Post(os.Getenv(envKillURL), "application/json", strings.NewReader(`{"amount":42}`))
	if err == nil {
		resp.Body.Close()
	}
	fmt.Println("paid:", err)
	select {}
}

// urlResumer rebuilds the unnamed payment.
type urlResumer struct{ url string }

func (r urlResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(`{"amount":42}`))
}

func (urlResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// Found in review hw1 (f949e43; was TestHW1KilledMidChargeThenTapOrResume).
func TestKilledMidChargeThenTapOrResume(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	for _, c := range []struct {
		name, path string
		resume     bool
	}{
		{"tap", "/pay", false},
		{"resume then tap", "/pay", true},
		{"tap, the charge on a 307's hop", "/redir", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newHoldingLedger(make(chan struct{}), make(chan struct{}))
			srv := httptest.NewServer(l)
			defer srv.Close()
			defer close(l.release)
			dir := t.TempDir()
			cmd := childtest.Command("TestKilledUnnamedPaymentChild", envKillDir+"="+dir, envKillURL+"="+srv.URL+c.path)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			select {
			case <-l.committed:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("the child's charge never arrived: %s", out.String())
			}
			require.NoError(t, cmd.Process.Kill()) // SIGKILL: no Close, no outcome
			_ = cmd.Wait()

			tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
			require.NoError(t, err)
			defer func() { require.NoError(t, tr.Close()) }()
			un, err := tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			require.NotEmpty(t, un, "the killed payment is not pending")
			if c.resume {
				res, err := tr.Resume(context.Background(), urlResumer{srv.URL + c.path}, 0)
				require.NoError(t, err)
				require.Len(t, res, 1)
				require.NoError(t, res[0].Err)
				assert.Equal(t, http.StatusCreated, res[0].Status)
			}
			resp, err := (&http.Client{Transport: tr}).Post(srv.URL+c.path, "application/json", strings.NewReader(`{"amount":42}`))
			require.NoError(t, err)
			resp.Body.Close()
			if c.resume {
				// Resumed to done: this tap is a deliberate repeat.
				assert.False(t, idemretry.IsReplay(resp))
				assert.Equal(t, 2, l.charges(), "keys %v", l.keys())
			} else {
				assert.True(t, idemretry.IsReplay(resp), "the tap of the killed payment was not its replay")
				assert.Equal(t, 1, l.charges(), "the tap of the killed payment charged again: keys %v", l.keys())
			}
			un, err = tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, un)
		})
	}
}

// Guarantee 6 for an unnamed payment that was redirected: once the app
// was given the hop's final answer, a deliberate repeat is a new payment,
// also when the app is killed right after (no Close, within the file
// journal's lazy second): the hop's done is as durable as an unnamed
// action's own.
//
// Found in review hw1 (f949e43; was TestHW1KilledAfterARedirectedUnnamedPaymentThenRepeat).
func TestKilledAfterARedirectedUnnamedPaymentThenRepeat(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	l := newHoldingLedger(nil, nil)
	srv := httptest.NewServer(l)
	defer srv.Close()
	dir := t.TempDir()
	cmd := childtest.Command("TestKilledUnnamedPaymentChild", envKillDir+"="+dir, envKillURL+"="+srv.URL+"/redir")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "paid:") {
				line <- sc.Text()
				return
			}
		}
		close(line)
	}()
	var got string
	select {
	case got = <-line:
	case <-time.After(20 * time.Second):
	}
	require.NoError(t, cmd.Process.Kill()) // at once: no Close
	_ = cmd.Wait()
	require.Equal(t, "paid: <nil>", got)
	require.Equal(t, 1, l.charges())

	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL+"/redir", "application/json", strings.NewReader(`{"amount":42}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.False(t, idemretry.IsReplay(resp), "the deliberate repeat was answered with the first payment's replay")
	assert.Equal(t, 2, l.charges(), "keys %v", l.keys())
}
