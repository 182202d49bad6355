package sqljournal_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry"
)

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
	if h, _ := leaseOf(t, probe, table, fleetAction); h != "" {
		t.Errorf("lease held by %q after every RoundTrip returned", h)
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
