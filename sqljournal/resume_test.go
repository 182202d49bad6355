package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

// leaseCheckingResumer is an app on machine B: Rebuild returns order A's
// request; Resolve asks the provider (the charge server) whether rec.Key
// was charged (or is being processed), and notes whether the action's lease
// was held by another machine when it was asked. An action the provider
// has no charge for is forgotten and the order paid again later.
type leaseCheckingResumer struct {
	srv   *chargeServer
	db    *sql.DB
	table string
	body  string

	mu             sync.Mutex
	resolved       int
	leaseHeldBy    string
	providerHadKey bool
}

func (r *leaseCheckingResumer) Rebuild(ctx context.Context, _ journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL, strings.NewReader(r.body))
}

func (r *leaseCheckingResumer) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	var holder sql.NullString
	_ = r.db.QueryRow(`SELECT lease_holder FROM "`+r.table+`" WHERE action_id = $1 AND lease_until > now()`, rec.ActionID).Scan(&holder)
	charged := r.srv.claimed(rec.Key)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resolved++
	r.leaseHeldBy = holder.String
	r.providerHadKey = charged
	return true, nil // charged: the order is paid; not charged: the app pays again
}

// Machine A sends pay:A; its request is on its way to the provider (held
// in the network: the provider has not seen the key yet) when the key
// window ends. A holds the action's lease for that whole time (README:
// "so that two machines resuming the same action do not both send its
// key"). Machine B runs Resume meanwhile: it lists pay:A pending, its
// rebuilt request's reserve finds the window ended, records the action
// outcome-unknown and hands it to Resolve at once, before the lease is
// even looked at (reserveLeased checks the lease only after reserve). The
// provider has no charge under the key, so the app forgets the action and
// pays order A again (a new key). A's request then reaches the provider:
// two charges for one order. Resolve must not run while another machine
// holds the action's lease (its request may be in the air).
//
// Found in review 3 of Resume (was TestReview3ResumeResolvesWhileAnotherMachineHoldsTheLease).
func TestResumeResolvesWhileAnotherMachineHoldsTheLease(t *testing.T) {
	const window = 1500 * time.Millisecond
	const body = `{"order":"A"}`
	probe := testDB(t)
	table := newTable(t, probe)
	srv, arrived, unblock := holdingMachineA(t)
	a := transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0))
	b := transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0))
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

	app := &leaseCheckingResumer{srv: srv, db: probe, table: table, body: body}
	res, err := b.Resume(ctx, app, 1)
	if err != nil {
		t.Fatal(err)
	}
	app.mu.Lock()
	resolved, heldBy, had := app.resolved, app.leaseHeldBy, app.providerHadKey
	app.mu.Unlock()
	for _, r := range res {
		t.Logf("B's resume: %s key %s: sent=%v forgotten=%v err=%v", r.Record.ActionID, r.Record.Key, r.Sent, r.Forgotten, r.Err)
	}
	t.Logf("Resolve calls %d; lease held by %q then; provider had the key: %v", resolved, heldBy, had)

	unblock()
	pa := <-resA
	t.Logf("A: %d %q %v", pa.status, pa.body, pa.err)
	if resolved > 0 && !had {
		// The app was told to pay again: it does.
		pb := post(ctx, b, srv.URL, "pay:A", body)
		t.Logf("B pays order A again: %d %q %v", pb.status, pb.body, pb.err)
	}
	if heldBy != "" {
		t.Errorf("Resolve ran while machine A held pay:A's lease (holder %q), its request in the air", heldBy)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("order A charged %d times", n)
	}
}

// As above, but B's Resume starts while A's window is still open: its
// rebuilt request finds pay:A leased by A and waits (lease.go); the loop
// reads the action again after each poll, whether or not the lease was
// released, and once A's window has ended that read records pay:A
// outcome-unknown and Resume hands it to Resolve, with A still holding the
// lease and its request in the air.
//
// Found in review 3 of Resume (was TestReview3ResumeLeaseWaitResolvesWhileTheLeaseIsHeld).
func TestResumeLeaseWaitResolvesWhileTheLeaseIsHeld(t *testing.T) {
	const window = 2 * time.Second
	const body = `{"order":"A"}`
	probe := testDB(t)
	table := newTable(t, probe)
	srv, arrived, unblock := holdingMachineA(t)
	a := transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0))
	b := transportOn(t, openOn(t, testDB(t), table), idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resA := make(chan payment, 1)
	go func() { resA <- post(ctx, as("A", a), srv.URL, "pay:A", body) }()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("A's request never left A")
	}
	time.Sleep(window / 3) // B's Resume starts within the window: it waits for A's lease

	app := &leaseCheckingResumer{srv: srv, db: probe, table: table, body: body}
	began := time.Now()
	res, err := b.Resume(ctx, app, 1)
	t.Logf("B's Resume returned after %v (it waited for A's lease)", time.Since(began))
	if err != nil {
		t.Fatal(err)
	}
	app.mu.Lock()
	resolved, heldBy, had := app.resolved, app.leaseHeldBy, app.providerHadKey
	app.mu.Unlock()
	for _, r := range res {
		t.Logf("B's resume: %s key %s: sent=%v forgotten=%v err=%v", r.Record.ActionID, r.Record.Key, r.Sent, r.Forgotten, r.Err)
	}
	t.Logf("Resolve calls %d; lease held by %q then; provider had the key: %v", resolved, heldBy, had)

	unblock()
	pa := <-resA
	t.Logf("A: %d %q %v", pa.status, pa.body, pa.err)
	if resolved > 0 && !had {
		// The app was told to pay again: it does.
		pb := post(ctx, b, srv.URL, "pay:A", body)
		t.Logf("B pays order A again: %d %q %v", pb.status, pb.body, pb.err)
	}
	if heldBy != "" {
		t.Errorf("Resolve ran while machine A held pay:A's lease (holder %q), its request in the air", heldBy)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("order A charged %d times", n)
	}
}

// holdingMachineA starts a charge server that holds machine A's requests
// (X-Machine: A) in the network, the provider not having seen them, until
// unblock; arrived is closed when the first arrives.
func holdingMachineA(t *testing.T) (srv *chargeServer, arrived <-chan struct{}, unblock func()) {
	srv = newUnstartedChargeServer(t)
	in, release := make(chan struct{}), make(chan struct{})
	var arrivedOnce, releaseOnce sync.Once
	unblock = func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	srv.before = func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Machine") == "A" {
			arrivedOnce.Do(func() { close(in) })
			<-release // in the network: the provider has not seen it yet
		}
		return false
	}
	srv.Start()
	return srv, in, unblock
}

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
//
// Found in review 4 of Resume (was TestReview4ResumeResolvesWhenTheLeaseCallFails).
func TestResumeResolvesWhenTheLeaseCallFails(t *testing.T) {
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
//
// Found in review 4 of Resume (was TestReview4ResumeResolvesAfterTheHoldersLeaseLapsed).
func TestResumeResolvesAfterTheHoldersLeaseLapsed(t *testing.T) {
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

// pausedJournal is machine A's journal: its Resume is paused after
// Unfinished has listed (until gateList closes) and in its first Forget
// (until gateForget closes, after closing inForget): a slow database call,
// or a process paused (GC, a VM's steal time) between two calls.
type pausedJournal struct {
	*sqljournal.Journal
	listed, inForget     chan struct{}
	gateList, gateForget chan struct{}
	once                 sync.Once
}

func (j *pausedJournal) Unfinished(ctx context.Context) ([]journal.Record, error) {
	recs, err := j.Journal.Unfinished(ctx)
	close(j.listed)
	<-j.gateList
	return recs, err
}

func (j *pausedJournal) Forget(ctx context.Context, id string) error {
	first := false
	j.once.Do(func() { first = true })
	if first {
		close(j.inForget)
		<-j.gateForget
	}
	return j.Journal.Forget(ctx, id)
}

// stillUnknown's "forget again" (fefbf4b) forgets by action id whatever the
// table holds by then, without a lease (the first re-read comes before
// reconcile takes one). Machine A's Resume listed pay:A outcome-unknown
// under K1. Machine B's Resume resolves it (no charge) and forgets it; A's
// stillUnknown re-creates K1 and, before its Forget, B's app pays order A
// again: refused (the re-created record), so B runs Resume again, which
// resolves K1 (no charge), forgets it, and pays order A under K2, its
// request at the provider (B holds pay:A's lease). Then A's Forget deletes
// pay:A's row: K2's, with its request in the air. Order A is tapped again
// once K2 is charged: the table has no pay:A, so it is paid under K3.
//
// Found in review 5 of Resume (was TestReview5StillUnknownForgetDeletesAnotherMachinesPayment).
func TestResumeStillUnknownForgetDeletesAnotherMachinesPayment(t *testing.T) {
	const window = time.Second
	const body = `{"order":"A"}`
	probe := testDB(t)
	table := newTable(t, probe)
	srv := newUnstartedChargeServer(t)
	var mu sync.Mutex
	n, blockNext := 0, false
	arrived, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	srv.before = func(w http.ResponseWriter, _ *http.Request) bool {
		mu.Lock()
		n++
		first, block := n == 1, blockNext
		blockNext = false
		mu.Unlock()
		switch {
		case first: // lost before the provider processed it
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.Close()
			}
			return true
		case block:
			close(arrived)
			<-release // the provider is slow with K2
		}
		return false
	}
	srv.Start()
	opts := []idemretry.Option{idemretry.WithKeyWindow(window), idemretry.WithSettleTime(0), idemretry.WithMaxRetries(0)}
	pj := &pausedJournal{Journal: openOn(t, testDB(t), table), listed: make(chan struct{}), inForget: make(chan struct{}),
		gateList: make(chan struct{}), gateForget: make(chan struct{})}
	var listOnce, forgetOnce sync.Once
	openList := func() { listOnce.Do(func() { close(pj.gateList) }) }
	openGates := func() { openList(); forgetOnce.Do(func() { close(pj.gateForget) }) }
	t.Cleanup(openGates)
	a := transportOn(t, pj, opts...)
	b := transportOn(t, openOn(t, testDB(t), table), opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if p := post(ctx, b, srv.URL, "pay:A", body); p.err == nil {
		t.Fatalf("the lost request answered %d", p.status)
	}
	time.Sleep(window + 300*time.Millisecond)
	if p := post(ctx, b, srv.URL, "pay:A", body); p.err == nil {
		t.Fatalf("a tap after the window answered %d", p.status)
	}
	type out struct {
		res []idemretry.ResumeResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := a.Resume(ctx, &leaseCheckingResumer{srv: srv, db: probe, table: table, body: body}, 1)
		done <- out{res, err}
	}()
	<-pj.listed // A listed pay:A unknown under K1

	app := &leaseCheckingResumer{srv: srv, db: probe, table: table, body: body}
	res, err := b.Resume(ctx, app, 1)
	if err != nil || len(res) != 1 || !res[0].Forgotten || app.providerHadKey {
		t.Fatalf("B's Resume: %+v %v", res, err)
	}
	openList()
	// A reads pay:A again through the journal's Get: gone, so it creates
	// nothing and forgets nothing (a Forget of its would be held here, and
	// delete whatever B has made of pay:A since).
	o := <-done
	if o.err != nil || len(o.res) != 1 {
		t.Fatalf("A's Resume: %+v %v", o.res, o.err)
	}
	t.Logf("A's Resume: forgotten=%v err=%v; rows: %+v", o.res[0].Forgotten, o.res[0].Err, rowsOf(t, probe, table))
	if !errors.Is(o.res[0].Err, idemretry.ErrNotResumable) {
		t.Errorf("A's Resume: %v, want ErrNotResumable", o.res[0].Err)
	}
	select {
	case <-pj.inForget:
		t.Fatal("A's Resume forgot pay:A after B had reconciled it")
	default:
	}
	mu.Lock()
	blockNext = true
	mu.Unlock()
	repaid := make(chan payment, 1)
	go func() { repaid <- post(ctx, b, srv.URL, "pay:A", body) }()
	<-arrived // K2 pending, its request at the provider
	t.Logf("rows with K2 in the air: %+v", rowsOf(t, probe, table))
	unblock()
	p := <-repaid
	t.Logf("B's payment under K2: %d %v", p.status, p.err)
	tap := post(ctx, b, srv.URL, "pay:A", body)
	t.Logf("a tap of order A: %d %v; rows: %+v", tap.status, tap.err, rowsOf(t, probe, table))
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("order A charged %d times", n)
	}
}

// orderResumer rebuilds the payment of order rec.ActionID names
// ("pay:<order>") to url; Resolve keeps every action.
type orderResumer struct{ url string }

func (r orderResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	order := strings.TrimPrefix(rec.ActionID, "pay:")
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(`{"order":"`+order+`"}`))
}

func (orderResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// Three payments were charged and their answers lost; then one row was
// damaged (attempts -1, by hand). At start-up Resume resends the two intact
// ones (each answered by the server's replay, no new charge) and gives the
// damaged one a result of its own, its Err journal.ErrCorruptRecord, its
// id as Forget takes it, nothing sent. Before, Unfinished failed whole on
// the one row, so Resume returned no result at all and an error naming
// pay:bad only as text: the app resumed nothing until someone repaired or
// deleted the row by hand.
func TestResumeResendsTheIntactActionsBesideADamagedRow(t *testing.T) {
	db := testDB(t)
	j, table := openJournal(t, db)
	srv := newUnstartedChargeServer(t) // charges, loses every answer, replays a stored one
	srv.dropAnswers = true
	srv.Start()
	orders := []string{"good-1", "bad", "good-2"}
	tr := transportOn(t, j, idemretry.WithMaxRetries(0))
	for _, o := range orders {
		if p := post(context.Background(), tr, srv.URL, "pay:"+o, `{"order":"`+o+`"}`); p.err == nil {
			t.Fatalf("%s: the answer was not lost: %+v", o, p)
		}
	}
	if _, err := db.Exec(`UPDATE "`+table+`" SET attempts = -1 WHERE action_id = $1`, "pay:bad"); err != nil {
		t.Fatal(err)
	}

	res, err := transportOn(t, j).Resume(context.Background(), orderResumer{srv.URL}, 0)
	for _, r := range res {
		t.Logf("%s: sent %v, status %d, %v", r.Record.ActionID, r.Sent, r.Status, r.Err)
	}
	if err != nil {
		t.Fatalf("Resume: %v (%d results): the intact actions were not resumed", err, len(res))
	}
	if len(res) != 3 {
		t.Fatalf("%d results, want 3", len(res))
	}
	byID := map[string]idemretry.ResumeResult{}
	for _, r := range res {
		byID[r.Record.ActionID] = r
	}
	for _, o := range []string{"good-1", "good-2"} {
		if r := byID["pay:"+o]; r.Err != nil || r.Status != http.StatusOK || !r.Outcome.Replayed {
			t.Errorf("pay:%s: %+v, want resent and answered by the replay", o, r)
		}
	}
	bad, ok := byID["pay:bad"]
	if !ok || !errors.Is(bad.Err, journal.ErrCorruptRecord) || !errors.Is(bad.Err, sqljournal.ErrMalformedRecord) || bad.Sent {
		t.Errorf("pay:bad: %+v, want its own result, sqljournal.ErrMalformedRecord, nothing sent", bad)
	}
	if n := srv.chargeCount(); n != 3 {
		t.Errorf("%d charges, want the 3 of the first run", n)
	}
	if keys := srv.keysOf(`{"order":"bad"}`); len(keys) != 1 {
		t.Errorf("the damaged payment arrived %d times, want once (the first run)", len(keys))
	}
	// The app reconciles it with the provider, then forgets it by the id
	// its result gives: the table holds no damaged row any more.
	if err := j.Forget(context.Background(), bad.Record.ActionID); err != nil {
		t.Fatal(err)
	}
	if un, err := j.Unfinished(context.Background()); err != nil || len(un) != 0 {
		t.Errorf("Unfinished after Forget: %d records, %v; want none, no error", len(un), err)
	}
}

// A pending row whose state was damaged (UPDATE state = 7, or 0: no state
// a Journal writes), as machine A lists the table while machine B, on a
// pool of its own, takes a tap of the same payment: A's Unfinished names
// the row in a *journal.CorruptRecordsError beside the intact one, so
// Resume gives it a result of its own (nothing sent), and B's Reserve is
// refused (ErrMalformedRecord): no new key for a payment that was charged.
// Before, Unfinished read only the rows in state 1 or 3: the damaged row
// was left out with no error, and Resume said nothing of it.
func TestResumeNamesARowWhoseStateWasDamaged(t *testing.T) {
	for _, state := range []int{0, 7} {
		t.Run(fmt.Sprintf("state=%d", state), func(t *testing.T) {
			dbA, dbB := testDB(t), testDB(t)
			ja, table := openJournal(t, dbA)
			jb := openOn(t, dbB, table)
			srv := newUnstartedChargeServer(t)
			srv.dropAnswers = true
			srv.Start()
			tr := transportOn(t, ja, idemretry.WithMaxRetries(0))
			for _, o := range []string{"good", "bad"} {
				if p := post(context.Background(), tr, srv.URL, "pay:"+o, `{"order":"`+o+`"}`); p.err == nil {
					t.Fatalf("%s: the answer was not lost: %+v", o, p)
				}
			}
			if _, err := dbA.Exec(`UPDATE "`+table+`" SET state = $2 WHERE action_id = $1`, "pay:bad", state); err != nil {
				t.Fatal(err)
			}

			res, err := transportOn(t, ja).Resume(context.Background(), orderResumer{srv.URL}, 0)
			for _, r := range res {
				t.Logf("%s: sent %v, status %d, %v", r.Record.ActionID, r.Sent, r.Status, r.Err)
			}
			if err != nil {
				t.Fatalf("Resume: %v", err)
			}
			byID := map[string]idemretry.ResumeResult{}
			for _, r := range res {
				byID[r.Record.ActionID] = r
			}
			if r := byID["pay:good"]; r.Err != nil || !r.Outcome.Replayed {
				t.Errorf("pay:good: %+v, want resent and replayed", r)
			}
			bad, ok := byID["pay:bad"]
			if !ok || !errors.Is(bad.Err, sqljournal.ErrMalformedRecord) || bad.Sent {
				t.Errorf("pay:bad: %+v (listed %v), want its own result, ErrMalformedRecord, nothing sent", bad, ok)
			} else if msg := bad.Err.Error(); strings.Count(msg, "idemretry: ") != 1 {
				t.Errorf("pay:bad: %q, want the idemretry: prefix once", msg)
			}
			p := post(context.Background(), transportOn(t, jb), srv.URL, "pay:bad", `{"order":"bad"}`)
			if !errors.Is(p.err, sqljournal.ErrMalformedRecord) {
				t.Errorf("machine B's tap of pay:bad: %+v, want ErrMalformedRecord", p)
			}
			if keys := srv.keysOf(`{"order":"bad"}`); len(keys) != 1 {
				t.Errorf("the damaged payment was sent under %d keys, want its first one only", len(keys))
			}
		})
	}
}
