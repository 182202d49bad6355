package sqljournal_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/sqljournal"
)

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
func TestReview5StillUnknownForgetDeletesAnotherMachinesPayment(t *testing.T) {
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
