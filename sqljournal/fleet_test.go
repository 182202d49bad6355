package sqljournal_test

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// Two processes, one database: each child process is a machine of a fleet,
// with its own pool, Journal and Transport on one table, resuming the same
// payment action against one loopback server.

// Environment of a fleet child (TestFleetChild).
const (
	envFleetChild  = "IDEMRETRY_FLEET_CHILD" // the machine's name
	envFleetTable  = "IDEMRETRY_FLEET_TABLE"
	envFleetURL    = "IDEMRETRY_FLEET_URL"
	envFleetLease  = "IDEMRETRY_FLEET_LEASE" // "off": the machine does not lease
	envFleetTTL    = "IDEMRETRY_FLEET_TTL"   // WithLeaseTTL, if set
	fleetAction    = "pay:order-9"
	fleetBody      = `{"order":9,"amount":4200}`
	machineHeader  = "X-Machine"
	resumingLine   = "resuming"
	resultLinePref = "result "
)

// TestFleetChild is one machine: it resumes the action and prints the
// outcome. It runs only as a child of the fleet tests.
func TestFleetChild(t *testing.T) {
	name := os.Getenv(envFleetChild)
	if name == "" {
		t.Skip("a child of the fleet tests")
	}
	db, err := sql.Open("pgx", os.Getenv(dsnEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	j, err := sqljournal.Open(ctx, db, sqljournal.WithTable(os.Getenv(envFleetTable)))
	if err != nil {
		t.Fatal(err)
	}
	var jr journal.Journal = j
	if os.Getenv(envFleetLease) == "off" {
		jr = noLease{j}
	}
	opts := []idemretry.Option{idemretry.WithJournal(jr), idemretry.WithMaxRetries(10),
		idemretry.WithBackOff(func() backoff.BackOff {
			return idemretry.NewFullJitter(20*time.Millisecond, 200*time.Millisecond, nil)
		}),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))}
	if ttl := os.Getenv(envFleetTTL); ttl != "" {
		d, err := time.ParseDuration(ttl)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, idemretry.WithLeaseTTL(d))
	}
	tr, err := idemretry.NewTransport(&http.Transport{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rt := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		r.Header.Set(machineHeader, name)
		return tr.RoundTrip(r)
	})
	fmt.Println(resumingLine)
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	p := post(cctx, rt, os.Getenv(envFleetURL), fleetAction, fleetBody)
	fmt.Printf("%sstatus=%d replay=%v err=%v\n", resultLinePref, p.status, p.replay, p.err)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// child is a running child process of a test.
type child struct {
	cmd  *exec.Cmd
	out  *bufio.Reader
	in   io.WriteCloser // its standard input
	name string
}

// startChild starts machine name on table against url; lease "off" makes
// it a machine that does not lease. It is killed when t ends if still
// running.
func startChild(t *testing.T, name, table, url, lease, ttl string) *child {
	t.Helper()
	return startTestChild(t, name, "TestFleetChild", envFleetChild+"="+name, envFleetTable+"="+table,
		envFleetURL+"="+url, envFleetLease+"="+lease, envFleetTTL+"="+ttl)
}

// startTestChild runs this test binary's test run (a TestXChild) as a
// child process named name, with env added to this one's. It is killed
// when t ends if still running.
func startTestChild(t *testing.T, name, run string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: bufio.NewReader(out), in: in, name: name}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// line returns the child's next line that starts with prefix, within 60 s.
func (c *child) line(t *testing.T, prefix string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		for {
			l, err := c.out.ReadString('\n')
			if strings.HasPrefix(l, prefix) || err != nil {
				got <- strings.TrimSpace(l)
				return
			}
		}
	}()
	select {
	case l := <-got:
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("machine %s ended without a %q line", c.name, prefix)
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatalf("machine %s printed no %q line in 60 s", c.name, prefix)
	}
	return ""
}

// result waits for the child's outcome line and its exit.
func (c *child) result(t *testing.T) string {
	t.Helper()
	l := strings.TrimPrefix(c.line(t, resultLinePref), resultLinePref)
	_, _ = io.Copy(io.Discard, c.out)
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("machine %s: %v", c.name, err)
	}
	return l
}

// fleetServer is chargeServer recording every request: which machine sent
// it, under which key, what it was answered, when. The first fail requests
// are answered 503; a charge is held until finish.
type fleetServer struct {
	*chargeServer
	release     chan struct{}
	releaseOnce sync.Once
	charged     chan string // the machine of each charge, as it starts

	mu       sync.Mutex
	fail     int
	requests []fleetRequest
}

type fleetRequest struct {
	machine, key string
	status       int
	at           time.Time
}

func newFleetServer(t *testing.T, fail int) *fleetServer {
	s := &fleetServer{chargeServer: newUnstartedChargeServer(t), release: make(chan struct{}), charged: make(chan string, 10), fail: fail}
	s.before = func(w http.ResponseWriter, r *http.Request) bool {
		s.mu.Lock()
		down := s.fail > 0
		if down {
			s.fail--
		}
		s.mu.Unlock()
		if down {
			s.log(r, http.StatusServiceUnavailable)
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
		return down
	}
	s.answered = s.log
	s.process = func(_ int, r *http.Request) {
		s.charged <- r.Header.Get(machineHeader)
		<-s.release // the charge takes its time; it completes even if the client is gone
	}
	t.Cleanup(s.finish) // before chargeServer's Close, which waits for the charges held
	s.Start()
	return s
}

// log records r and the status it is answered with.
func (s *fleetServer) log(r *http.Request, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, fleetRequest{r.Header.Get(machineHeader), r.Header.Get("Idempotency-Key"), status, time.Now()})
}

// finish lets every charge complete.
func (s *fleetServer) finish() { s.releaseOnce.Do(func() { close(s.release) }) }

// tally returns the charges, the 409s, the keys seen and the requests.
func (s *fleetServer) tally() (charges, conflicts int, keys map[string]int, reqs []fleetRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys = map[string]int{}
	for _, r := range s.requests {
		keys[r.key]++
		if r.status == http.StatusConflict {
			conflicts++
		}
	}
	return s.chargeCount(), conflicts, keys, append([]fleetRequest(nil), s.requests...)
}

// requestsOf returns the requests machine sent.
func (s *fleetServer) requestsOf(machine string) []fleetRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []fleetRequest
	for _, r := range s.requests {
		if r.machine == machine {
			out = append(out, r)
		}
	}
	return out
}

// seedPending leaves the action pending in table under a key, as an
// earlier run that failed would: one attempt answered 503, no retries. It
// returns the key.
func seedPending(t *testing.T, table, url string) string {
	t.Helper()
	tr := transportOn(t, openOn(t, testDB(t), table), idemretry.WithMaxRetries(0))
	if p := post(context.Background(), tr, url, fleetAction, fleetBody); p.status != http.StatusServiceUnavailable {
		t.Fatalf("seeding: %+v, want the 503", p)
	}
	rows := rowsOf(t, testDB(t), table)
	if len(rows) != 1 || rows[0].state != journal.StatePending {
		t.Fatalf("seeded %+v, want one pending record", rows)
	}
	return rows[0].key
}

// Two machines resume the same pending action at once, while the first
// one's request is being processed (slowly) by a server that answers 409 to
// a request whose key is in flight. With leases the second machine waits
// for the first (which releases the lease when done) and then gets the
// stored answer: no 409, one charge, one key. Without them it sends
// alongside and is answered 409 on every retry (shown by the "no lease"
// case, the behaviour before leases).
func TestFleetOneMachineInFlight(t *testing.T) {
	for _, lease := range []string{"on", "off"} {
		t.Run("lease "+lease, func(t *testing.T) {
			table := newTable(t, testDB(t))
			srv := newFleetServer(t, 1)
			key := seedPending(t, table, srv.URL)

			a := startChild(t, "A", table, srv.URL, lease, "")
			select {
			case m := <-srv.charged:
				if m != "A" {
					t.Fatalf("charge by %s, want A", m)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("A's request never reached the server")
			}
			b := startChild(t, "B", table, srv.URL, lease, "")
			b.line(t, resumingLine)
			// A's charge is in progress while B resumes the action: long
			// enough for B to send several times if it sends at all.
			time.Sleep(1500 * time.Millisecond)
			if lease == "off" {
				waitFor(t, "B's first 409", func() bool { _, c, _, _ := srv.tally(); return c > 0 })
				time.Sleep(500 * time.Millisecond)
			}
			srv.finish()
			ra, rb := a.result(t), b.result(t)
			charges, conflicts, keys, reqs := srv.tally()
			t.Logf("lease %s: A %s; B %s; %d charge(s), %d answered 409, keys %v", lease, ra, rb, charges, conflicts, keys)
			for _, r := range reqs {
				t.Logf("  %s %s %d", r.machine, r.key, r.status)
			}
			if charges != 1 || len(keys) != 1 || keys[key] == 0 {
				t.Errorf("%d charges under keys %v, want one charge under the seeded key %s", charges, keys, key)
			}
			if lease == "off" {
				if conflicts == 0 {
					t.Errorf("without leases: no 409; the contrast shows nothing")
				}
				return
			}
			if conflicts != 0 {
				t.Errorf("with leases: the server answered %d requests 409, want none (one machine in flight)", conflicts)
			}
			if ra != "status=200 replay=false err=<nil>" || rb != "status=200 replay=true err=<nil>" {
				t.Errorf("A %q, B %q; want A's charge and B its replay", ra, rb)
			}
			probe := testDB(t)
			rows := rowsOf(t, probe, table)
			if len(rows) != 1 || rows[0].state != journal.StateDone || rows[0].status != http.StatusOK {
				t.Errorf("journal: %+v, want done with 200", rows)
			}
			if h := leaseAfterRelease(t, probe, table, fleetAction); h != "" {
				t.Errorf("lease still held by %q a release bound after both machines finished", h)
			}
		})
	}
}

// A machine that dies holding an action's lease (SIGKILL, its request in
// the server's hands) holds up the others for the rest of the lease, which
// it had kept renewing for longer than the TTL while it waited for the
// server; then another machine takes the action over, once the lease has
// ended by the database's clock and not before, with the same key, and gets
// the server's stored answer: one charge, no 409.
func TestFleetTakeoverAfterKill(t *testing.T) {
	const ttl = 3 * time.Second
	probe := testDB(t)
	table := newTable(t, probe)
	srv := newFleetServer(t, 0)

	a := startChild(t, "A", table, srv.URL, "on", ttl.String())
	select {
	case <-srv.charged:
	case <-time.After(60 * time.Second):
		t.Fatal("A's request never reached the server")
	}
	b := startChild(t, "B", table, srv.URL, "on", ttl.String())
	b.line(t, resumingLine)
	// Longer than the TTL: A's renewals keep the lease while its request
	// is in the server's hands, so B does not send.
	time.Sleep(ttl + time.Second)
	var (
		holder sql.NullString
		leftMs sql.NullInt64
	)
	if err := probe.QueryRow(`SELECT lease_holder, (extract(epoch FROM lease_until - clock_timestamp()) * 1000)::bigint FROM "`+table+`" WHERE action_id = $1`,
		fleetAction).Scan(&holder, &leftMs); err != nil {
		t.Fatal(err)
	}
	if !holder.Valid || !leftMs.Valid {
		t.Fatalf("no machine holds the action's lease while A's request is in flight (B's requests: %d)", len(srv.requestsOf("B")))
	}
	read := time.Now()
	left := time.Duration(leftMs.Int64) * time.Millisecond
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	srv.finish() // the charge completes on the server, the answer lost with A
	rb := b.result(t)

	charges, conflicts, keys, reqs := srv.tally()
	t.Logf("lease of %s had %v left when A was killed; B: %s; %d charge(s), %d answered 409, keys %v", holder.String, left, rb, charges, conflicts, keys)
	if len(reqs) != 2 || reqs[0].machine != "A" || reqs[1].machine != "B" {
		t.Fatalf("requests %+v, want A's and then B's", reqs)
	}
	if took := reqs[1].at.Sub(read); took < left-20*time.Millisecond {
		t.Errorf("B sent %v after the lease was read with %v left: it took over before the lease ended", took, left)
	}
	if reqs[0].key != reqs[1].key || charges != 1 || conflicts != 0 {
		t.Errorf("keys %s and %s, %d charges, %d 409s; want one key, one charge, none", reqs[0].key, reqs[1].key, charges, conflicts)
	}
	if rb != "status=200 replay=true err=<nil>" {
		t.Errorf("B: %q, want the stored answer", rb)
	}
	rows := rowsOf(t, probe, table)
	if len(rows) != 1 || rows[0].state != journal.StateDone || rows[0].status != http.StatusOK {
		t.Errorf("journal: %+v, want done with 200", rows)
	}
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}

// A named action's large body across a fleet sharing one PostgreSQL
// journal. sqljournal keeps no fingerprint secret (it is no
// journal.FingerprintKeeper), so its rows hold plain SHA-256 fingerprints
// whatever the machine's CPU: a keyed one, whose key no other machine
// would share, must never reach the table. Every machine checks another's
// record from the row it reads back. Ported from the review of hF2.

// reviewLargeBody is a payment file of four full 64 KiB chunks and a part.
func reviewLargeBody(order string) string {
	const n = 4<<16 + 777
	line := `{"line":"` + order + `","amount":1000}` + "\n"
	return strings.Repeat(line, n/len(line)+1)[:n]
}

// reviewChanged returns the variants of p a machine must refuse under p's
// action: a byte changed in the first and in the last chunk, one byte
// shorter, one longer.
func reviewChanged(p string) []string {
	flip := func(i int) string { b := []byte(p); b[i] ^= 0x20; return string(b) }
	return []string{flip(3), flip(len(p) - 1), p[:len(p)-1], p + "x"}
}

// reviewPost is post with the body's length unknown when unknownLength
// (the plain form for the sender's own fingerprint: checked under the
// record's keyed one all the same).
func reviewPost(ctx context.Context, rt http.RoundTripper, url, action, body string, unknownLength bool) payment {
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, action), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return payment{err: err}
	}
	if unknownLength {
		req.ContentLength = -1
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return payment{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return payment{status: resp.StatusCode, body: string(b), replay: idemretry.IsReplay(resp), err: err}
}

// keyedRow reports whether table's record of action holds a keyed
// fingerprint ("irk\x01", a key id, a salt and a digest).
func keyedRow(t *testing.T, table, action string) bool {
	t.Helper()
	var fp []byte
	if err := testDB(t).QueryRow(`SELECT fingerprint FROM "`+table+`" WHERE action_id = $1`, action).Scan(&fp); err != nil {
		t.Fatal(err)
	}
	return bytes.HasPrefix(fp, []byte("irk\x01"))
}

// Machine A sends a large named payment; the server charges it and the
// answer is lost, so the row stays pending under A's key, its fingerprint
// plain.
// Machine B (its own pool, journal and Transport) refuses the changed
// payloads with ErrFingerprintMismatch, sending nothing, and sends the
// same payload under A's key, which the server replays: one charge.
func TestLargeNamedFleetPendingRecordPlain(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		name := "B knows the length"
		if unknown {
			name = "B's length unknown"
		}
		t.Run(name, func(t *testing.T) {
			srv := newChargeServer(t)
			srv.dropAnswers = true
			table := newTable(t, testDB(t))
			a := transportOn(t, openOn(t, testDB(t), table), idemretry.WithMaxRetries(0))
			b := transportOn(t, openOn(t, testDB(t), table), idemretry.WithMaxRetries(0))
			const action = "pay:big-1"
			payload := reviewLargeBody("big-1")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			if p := reviewPost(ctx, a, srv.URL, action, payload, false); p.err == nil {
				t.Fatalf("A: %+v, want the lost answer's error", p)
			}
			rows := rowsOf(t, testDB(t), table)
			if len(rows) != 1 || srv.chargeCount() != 1 {
				t.Fatalf("after A: rows %+v, %d charges; want one pending row, one charge", rows, srv.chargeCount())
			}
			if keyedRow(t, table, action) {
				t.Fatal("a keyed fingerprint in a PostgreSQL row: sqljournal keeps no secret")
			}
			for i, other := range reviewChanged(payload) {
				p := reviewPost(ctx, b, srv.URL, action, other, unknown)
				if !errors.Is(p.err, idemretry.ErrFingerprintMismatch) {
					t.Errorf("B with changed payload %d: %+v, want ErrFingerprintMismatch", i, p)
				}
				if keys := srv.keysOf(other); len(keys) != 0 {
					t.Errorf("B sent changed payload %d under %v", i, keys)
				}
			}
			p := reviewPost(ctx, b, srv.URL, action, payload, unknown)
			if p.err != nil || p.status != http.StatusOK || !p.replay {
				t.Fatalf("B with A's payload: %+v, want the replay of A's charge", p)
			}
			if keys := srv.keysOf(payload); len(keys) != 2 || keys[0] != keys[1] || keys[0] != rows[0].key {
				t.Errorf("the payload arrived under %v; want A's key %s twice", keys, rows[0].key)
			}
			if n := srv.chargeCount(); n != 1 {
				t.Errorf("%d charges, want 1", n)
			}
		})
	}
}

// With leases: A's large named payment is in flight (the server holds the
// charge). B's changed payload is refused at once, nothing sent; B's same
// payload waits for A's lease, then recognises the payload under A's
// record and is sent under A's key: the server's replay, one charge.
func TestLargeNamedFleetWaitsForLeaseThenRecognises(t *testing.T) {
	srv := newFleetServer(t, 0)
	table := newTable(t, testDB(t))
	a := transportOn(t, openOn(t, testDB(t), table))
	b := transportOn(t, openOn(t, testDB(t), table))
	const action = "pay:big-2"
	payload := reviewLargeBody("big-2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	resA := make(chan payment, 1)
	go func() { resA <- reviewPost(ctx, as("A", a), srv.URL, action, payload, false) }()
	select {
	case <-srv.charged:
	case <-time.After(30 * time.Second):
		t.Fatal("A's request never reached the server")
	}
	if keyedRow(t, table, action) {
		srv.finish()
		<-resA
		t.Fatal("a keyed fingerprint in a PostgreSQL row: sqljournal keeps no secret")
	}
	for i, other := range reviewChanged(payload) {
		p := reviewPost(ctx, as("B", b), srv.URL, action, other, i%2 == 1)
		if !errors.Is(p.err, idemretry.ErrFingerprintMismatch) {
			t.Errorf("B with changed payload %d while A is in flight: %+v, want ErrFingerprintMismatch", i, p)
		}
	}
	resB := make(chan payment, 1)
	go func() { resB <- reviewPost(ctx, as("B", b), srv.URL, action, payload, false) }()
	time.Sleep(300 * time.Millisecond) // B is waiting for A's lease (or has not got there yet): either way it must wait
	if n := len(srv.requestsOf("B")); n != 0 {
		t.Errorf("B sent %d requests while A held the lease", n)
	}
	srv.finish()
	pa, pb := <-resA, <-resB
	if pa.err != nil || pa.status != http.StatusOK || pa.replay {
		t.Fatalf("A: %+v, want its charge's answer", pa)
	}
	if pb.err != nil || pb.status != http.StatusOK || !pb.replay || pb.body != pa.body {
		t.Fatalf("B: %+v, want the replay of A's answer %q", pb, pa.body)
	}
	charges, conflicts, keys, _ := srv.tally()
	if charges != 1 || conflicts != 0 || len(keys) != 1 {
		t.Errorf("%d charges, %d 409s, keys %v; want one charge, none, one key", charges, conflicts, keys)
	}
	if reqs := srv.requestsOf("B"); len(reqs) != 1 {
		t.Errorf("B sent %d requests, want its one replayed resend (the changed payloads none)", len(reqs))
	}
	noKeepers(t)
}

// cluster is a PostgreSQL server of one test's own, made by .ci/postgres.sh
// in a fresh directory, for faults that would disturb the shared server:
// stopping it, pausing it. It is stopped and deleted when the test ends.
type cluster struct {
	t      *testing.T
	base   string // IDEMRETRY_PG_BASE of postgres.sh
	dsn    string
	bindir string
	port   string
	paused []int
}

// ownCluster starts a cluster for t. It is skipped (failed under CI) when
// the tests have no PostgreSQL or this machine has no server binaries.
func ownCluster(t *testing.T) *cluster {
	t.Helper()
	testDB(t) // skip or fail as every PostgreSQL test does
	bindir := serverBindir()
	if bindir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin, and CI=true")
		}
		t.Skip("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: cannot start a cluster of the test's own")
	}
	var b [6]byte
	crand.Read(b[:])
	// Not t.TempDir: the cluster runs as user postgres when we are root,
	// and postgres.sh makes the directory itself, for that user.
	c := &cluster{t: t, base: filepath.Join(os.TempDir(), "sqlj-fault-"+hex.EncodeToString(b[:])), bindir: bindir}
	script := filepath.Join("..", ".ci", "postgres.sh")
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), "IDEMRETRY_PG_BASE="+c.base)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Cleanup(c.remove)
	if err != nil {
		t.Fatalf("start a cluster: %v\n%s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "export IDEMRETRY_PG_DSN="); ok {
			c.dsn = strings.Trim(v, "'")
		}
	}
	port, err := os.ReadFile(filepath.Join(c.base, "port"))
	if c.dsn == "" || err != nil {
		t.Fatalf("postgres.sh printed no DSN (%q) or port (%v)", out, err)
	}
	c.port = strings.TrimSpace(string(port))
	return c
}

// serverBindir returns the newest installed server's bin directory, or "".
func serverBindir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d
		}
	}
	return ""
}

// db returns a pool on the cluster, closed when the test ends. opts may
// adjust it before the first connection.
func (c *cluster) db() *sql.DB {
	db, err := sql.Open("pgx", c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	c.t.Cleanup(func() { db.Close() })
	return db
}

// pgCtl runs pg_ctl on the cluster's data as its owner.
func (c *cluster) pgCtl(args ...string) error {
	args = append([]string{filepath.Join(c.bindir, "pg_ctl"), "-D", filepath.Join(c.base, "data")}, args...)
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = c.base
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Logf("pg_ctl %v: %v\n%s", args, err, out)
	}
	return err
}

// stop stops the server at once, as a crash would (immediate mode: no
// checkpoint, clients cut off).
func (c *cluster) stop() {
	c.t.Helper()
	if err := c.pgCtl("-m", "immediate", "-w", "stop"); err != nil {
		c.t.Fatalf("stop the cluster: %v", err)
	}
}

// start starts the stopped server again on its port.
func (c *cluster) start() {
	c.t.Helper()
	if err := c.pgCtl("-l", filepath.Join(c.base, "server.log"), "-w", "-t", "60", "-o", "-p "+c.port, "start"); err != nil {
		c.t.Fatalf("start the cluster again: %v", err)
	}
}

// pause stops every process of the server with SIGSTOP: connections stay
// open and new ones are accepted by the kernel, but nothing answers.
func (c *cluster) pause() {
	c.t.Helper()
	pids := c.pids()
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			c.t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
	}
	c.paused = pids
}

// resume undoes pause.
func (c *cluster) resume() {
	for _, pid := range c.paused {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	c.paused = nil
}

// pids lists the postmaster and its children.
func (c *cluster) pids() []int {
	c.t.Helper()
	pidFile, err := os.ReadFile(filepath.Join(c.base, "data", "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("postmaster.pid: %v", err)
	}
	postmaster, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(pidFile), "\n", 2)[0]))
	if err != nil {
		c.t.Fatalf("postmaster.pid: %v", err)
	}
	pids := []int{postmaster}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// remove resumes, stops and deletes the cluster.
func (c *cluster) remove() {
	c.resume()
	cmd := exec.Command("bash", filepath.Join("..", ".ci", "postgres.sh"), "stop")
	cmd.Env = append(os.Environ(), "IDEMRETRY_PG_BASE="+c.base)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Errorf("remove the cluster in %s: %v\n%s", c.base, err, out)
	}
}

// within fails t unless f returns within d, and returns how long it took.
func within(t *testing.T, d time.Duration, what string, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); f() }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return 0
	}
}

// chaosServer is the shared payment server (internal/paytest) with
// injected faults: one new key in 10 is answered 503 (nothing charged),
// a charge takes up to 600 ms, and one in 3 loses its answer (the
// connection cut after the commit). Its ledger is by order (the body) and
// key.
type chaosServer struct {
	*httptest.Server
	pay  *paytest.Server
	mu   sync.Mutex
	rnd  *rand.Rand
	drop map[int]bool // by request number
	fail map[int]bool
}

func newChaosServer(t *testing.T, seed uint64) *chaosServer {
	s := &chaosServer{rnd: rand.New(rand.NewPCG(seed, 1)), drop: map[int]bool{}, fail: map[int]bool{}}
	s.pay = paytest.New(paytest.WithStatus(http.StatusOK),
		paytest.WithAnswerBody(func(c paytest.Charge) []byte {
			return fmt.Appendf(nil, `{"order":%q,"key":%q}`, c.Intent, c.Header.Get(paytest.KeyHeader))
		}),
		paytest.WithProcessing(func(n int, _ *http.Request) {
			s.mu.Lock()
			if s.rnd.IntN(10) == 0 {
				s.fail[n] = true
				s.mu.Unlock()
				return
			}
			slow := time.Duration(s.rnd.IntN(600)) * time.Millisecond
			s.drop[n] = s.rnd.IntN(3) == 0
			s.mu.Unlock()
			time.Sleep(slow)
		}),
		paytest.WithFailure(func(n int, _ *http.Request) (int, bool) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return http.StatusServiceUnavailable, s.fail[n]
		}),
		paytest.WithAfterCharge(func(n int, w http.ResponseWriter, _ *http.Request) bool {
			s.mu.Lock()
			drop := s.drop[n]
			s.mu.Unlock()
			if drop {
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
				}
			}
			return drop
		}))
	s.Server = httptest.NewServer(s.pay)
	t.Cleanup(s.Close)
	return s
}

// ledger returns the keys order was charged under and how many keys it
// reached the server with.
func (s *chaosServer) ledger(order string) (charges []string, keys int) {
	for _, c := range s.pay.ChargesOf(order) {
		charges = append(charges, c.Header.Get(paytest.KeyHeader))
	}
	seen := map[string]bool{}
	for _, r := range s.pay.Requests() {
		if string(r.Body) == order {
			seen[r.Header.Get(paytest.KeyHeader)] = true
		}
	}
	return charges, len(seen)
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
//
// Found in review hx1 (was TestReviewHX1FleetUnderFaults).
func TestFleetUnderFaults(t *testing.T) {
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
