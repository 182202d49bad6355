package sqljournal_test

// Two processes, one database: each child process is a machine of a fleet,
// with its own pool, Journal and Transport on one table, resuming the same
// payment action against one loopback server.

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/sqljournal"
)

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
			if h, _ := leaseOf(t, probe, table, fleetAction); h != "" {
				t.Errorf("lease still held by %q after both machines finished", h)
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
