package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// lockingJournal is machine B's journal: once arm is set, the first
// Reserve that reads an outcome-unknown record is followed by lock, an
// administrator's transaction that takes the table (LOCK TABLE, as a
// migration does) until the app's Resolve ends it (lockEndingResumer).
type lockingJournal struct {
	*sqljournal.Journal
	db    *sql.DB
	table string

	mu   sync.Mutex
	arm  bool
	lock *sql.Tx
}

func (j *lockingJournal) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	got, created, err := j.Journal.Reserve(ctx, rec, mode)
	j.mu.Lock()
	defer j.mu.Unlock()
	if err == nil && j.arm && got.State == journal.StateUnknown {
		j.arm = false
		if j.lock, err = holdLock(j.db, lockTable(j.table)); err != nil {
			return journal.Record{}, false, err
		}
	}
	return got, created, err
}

func (j *lockingJournal) unlock() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.lock != nil {
		_ = j.lock.Rollback()
		j.lock = nil
	}
}

// lockEndingResumer is leaseCheckingResumer whose Resolve first ends the
// administrator's lock: the provider call outlasts it.
type lockEndingResumer struct {
	*leaseCheckingResumer
	j *lockingJournal
}

func (r *lockEndingResumer) Resolve(ctx context.Context, rec journal.Record) (bool, error) {
	r.j.unlock()
	return r.leaseCheckingResumer.Resolve(ctx, rec)
}

// Machine A's request of pay:A is held in the network when its key window
// ends; A holds pay:A's lease all along. Machine B sends pay:A too: its
// reserve finds the window ended and records it outcome-unknown. Then
// B's Resume lists pay:A unknown and reads it again (stillUnknown); then an
// administrator's transaction locks the table (a migration) for longer than
// B's journal timeout, so B's Lease call fails (any transient journal error
// does the same), and reconcile goes on "without a
// lease" (leaseToResolve: err != nil -> held false, nil), which for a
// request is harmless ("a lease is for load, not for safety") but for
// Resolve is the only thing that says no request of the action is in the
// air on another machine. Resolve runs with A's lease held and A's request
// in the air; the provider has no charge under the key yet, the app
// forgets pay:A and pays again: two charges.
func TestReview4ResumeResolvesWhenTheLeaseCallFails(t *testing.T) {
	const window = 1500 * time.Millisecond
	const body = `{"order":"A"}`
	probe := testDB(t)
	table := newTable(t, probe)
	srv, arrived, unblock := holdingMachineA(t)
	a := transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0))
	jb := &lockingJournal{Journal: openOn(t, testDB(t), table), db: probe, table: table}
	t.Cleanup(jb.unlock)
	b := transportOn(t, jb, idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0),
		idemretry.WithJournalTimeout(500*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resA := make(chan payment, 1)
	go func() { resA <- post(ctx, as("A", a), srv.URL, "pay:A", body) }()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("A's request never left A")
	}
	time.Sleep(window + 300*time.Millisecond) // A's window ends with its request in the air
	if p := post(ctx, b, srv.URL, "pay:A", body); !errors.Is(p.err, idemretry.ErrKeyWindowExpired) {
		t.Fatalf("B's pay:A: %d %v, want ErrKeyWindowExpired", p.status, p.err)
	}

	jb.mu.Lock()
	jb.arm = true
	jb.mu.Unlock()
	app := &lockEndingResumer{leaseCheckingResumer: &leaseCheckingResumer{srv: srv, db: probe, table: table, body: body}, j: jb}
	res, err := b.Resume(ctx, app, 1)
	jb.unlock()
	if err != nil {
		t.Fatal(err)
	}
	app.mu.Lock()
	resolved, heldBy, had := app.resolved, app.leaseHeldBy, app.providerHadKey
	app.mu.Unlock()
	for _, r := range res {
		t.Logf("B's resume: %s key %s: forgotten=%v err=%v", r.Record.ActionID, r.Record.Key, r.Forgotten, r.Err)
	}
	t.Logf("Resolve calls %d; lease held by %q then; provider had the key: %v", resolved, heldBy, had)

	unblock()
	pa := <-resA
	t.Logf("A: %d %q %v", pa.status, pa.body, pa.err)
	if resolved > 0 && !had {
		pb := post(ctx, b, srv.URL, "pay:A", body) // the app pays again
		t.Logf("B pays order A again: %d %q %v", pb.status, pb.body, pb.err)
	}
	if heldBy != "" {
		t.Errorf("Resolve ran while machine A held pay:A's lease (holder %q), its request in the air: B's Lease call had failed", heldBy)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("order A charged %d times", n)
	}
}

// pgProxy forwards loopback connections to the test server, until cut:
// then every connection through it is closed and new ones are refused, as
// a network partition between one machine and the database does. While
// frozen it holds every byte in both directions, connections open, as a
// database that stopped answering (a paused server, a dropped route).
type pgProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
	frozen chan struct{} // closed by thaw; nil when not frozen
	wg     sync.WaitGroup
}

// freeze holds every byte through p until thaw (or partition).
func (p *pgProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil && !p.cut {
		p.frozen = make(chan struct{})
	}
}

// thaw lets the bytes held since freeze through.
func (p *pgProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// pipe copies src to dst, holding each read while p is frozen.
func (p *pgProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.frozen
			p.mu.Unlock()
			if frozen != nil {
				<-frozen
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func newPGProxy(t *testing.T, target string) *pgProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{l: l, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { p.partition(); p.wg.Wait() })
	return p
}

// proxiedDB returns a pool on the test server through a pgProxy of its
// own, both closed when t ends.
func proxiedDB(t *testing.T) (*sql.DB, *pgProxy) {
	t.Helper()
	testDB(t) // skip or fail as every PostgreSQL test does
	u, err := url.Parse(os.Getenv(dsnEnv))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newPGProxy(t, u.Host)
	u.Host = proxy.l.Addr().String()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, proxy
}

func (p *pgProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		p.mu.Lock()
		if err != nil || p.cut {
			p.mu.Unlock()
			c.Close()
			if s != nil {
				s.Close()
			}
			continue
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

func (p *pgProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// Machine A's request of pay:A is held in the network on its way to the
// provider; A holds pay:A's lease. Then A loses the database (a partition:
// its connections through pgProxy are cut), so it cannot renew the lease,
// which ends by the database's clock after A's TTL; its HTTP request is
// still in the air. Its key window ends too. Machine B, which reaches the
// database, records pay:A outcome-unknown (its own request is refused),
// and its Resume finds the lease free, takes it, and hands pay:A to
// Resolve: no charge under the key yet, so the app forgets it and pays
// again; A's request then reaches the provider: two charges. A lease that
// lapses says nothing about the holder's requests in the air (README:
// "Resolve is called only while no request of the action can be in the
// air ... holds its lease on PostgreSQL").
func TestReview4ResumeResolvesAfterTheHoldersLeaseLapsed(t *testing.T) {
	const window = 1500 * time.Millisecond
	const body = `{"order":"A"}`
	probe := testDB(t)
	table := newTable(t, probe)
	dbA, proxy := proxiedDB(t)

	srv, arrived, unblock := holdingMachineA(t)
	a := transportOn(t, openOn(t, dbA, table), idemretry.WithKeyWindow(window),
		idemretry.WithLeaseTTL(time.Second), idemretry.WithJournalTimeout(500*time.Millisecond))
	b := transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resA := make(chan payment, 1)
	go func() { resA <- post(ctx, as("A", a), srv.URL, "pay:A", body) }()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("A's request never left A")
	}
	proxy.partition()                         // A loses the database; its request is still in the air
	time.Sleep(window + 300*time.Millisecond) // A's lease (1 s) and window end
	if p := post(ctx, b, srv.URL, "pay:A", body); !errors.Is(p.err, idemretry.ErrKeyWindowExpired) {
		t.Fatalf("B's pay:A: %d %v, want ErrKeyWindowExpired", p.status, p.err)
	}

	app := &leaseCheckingResumer{srv: srv, db: probe, table: table, body: body}
	res, err := b.Resume(ctx, app, 1)
	if err != nil {
		t.Fatal(err)
	}
	app.mu.Lock()
	resolved, had := app.resolved, app.providerHadKey
	app.mu.Unlock()
	for _, r := range res {
		t.Logf("B's resume: %s key %s: forgotten=%v err=%v", r.Record.ActionID, r.Record.Key, r.Forgotten, r.Err)
	}
	t.Logf("Resolve calls %d; provider had the key: %v", resolved, had)

	unblock()
	pa := <-resA
	t.Logf("A: %d %q %v", pa.status, pa.body, pa.err)
	if resolved > 0 && !had {
		pb := post(ctx, b, srv.URL, "pay:A", body) // the app pays again
		t.Logf("B pays order A again: %d %q %v", pb.status, pb.body, pb.err)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("order A charged %d times: B resolved pay:A while A's request was in the air, its lease lapsed", n)
	}
}
