package sqljournal_test

import (
	"context"
	"database/sql"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
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
	r.srv.mu.Lock()
	_, stored := r.srv.stored[rec.Key]
	charged := stored || r.srv.busy[rec.Key]
	r.srv.mu.Unlock()
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
func TestReview3ResumeResolvesWhileAnotherMachineHoldsTheLease(t *testing.T) {
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
func TestReview3ResumeLeaseWaitResolvesWhileTheLeaseIsHeld(t *testing.T) {
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
