package sqljournal_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

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
