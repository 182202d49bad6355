package sqljournal_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemretry/idemretry/sqljournal"
)

// A payment named by its fingerprint is charged and answered, and then the
// journal write of its outcome (done) fails: its connection is killed while
// it waits for a row lock, or the database stops right after the request
// was sent. The record stays pending. A deliberate identical payment after
// that must not be answered with the first one's replay (two payments, one
// charge): it must get a new key and be charged, or fail with an error
// before anything is sent. (Issue 7, item 4; the Transport keeps such an
// outcome in memory and lands it before the next Reserve of the action.)
func TestFailedDoneNoReusedKey(t *testing.T) {
	t.Run("ConnectionKilled", func(t *testing.T) {
		db := testDB(t)
		j, table := openJournal(t, db)
		srv := newChargeServer(t)
		killed := make(chan struct{})
		srv.process = func(n int, _ *http.Request) {
			if n != 1 {
				return
			}
			// Before the answer leaves: lock the action's row, so that the
			// Transport's update to done waits; kill that update's
			// connection, then let go.
			holder, err := holdLock(db, lockRows(table))
			if err != nil {
				t.Error(err)
				close(killed)
				return
			}
			go func() {
				defer close(killed)
				defer holder.Rollback()
				pid, err := lockWaiter(db, table)
				if err != nil {
					t.Error(err)
					return
				}
				var ok bool
				if err := db.QueryRow(`SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
					t.Errorf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
				}
			}()
		}
		secondPayment(t, srv, transportOn(t, j), func() { <-killed })
	})

	t.Run("DatabaseStopped", func(t *testing.T) {
		c := ownCluster(t)
		j, err := sqljournal.Open(context.Background(), c.db())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		srv := newChargeServer(t)
		srv.process = func(n int, _ *http.Request) {
			if n == 1 { // the request was sent and charged: the database goes
				if err := c.pgCtl("-m", "immediate", "-w", "stop"); err != nil {
					t.Errorf("stop the cluster: %v", err)
				}
			}
		}
		secondPayment(t, srv, transportOn(t, j), c.start)
	})
}

// secondPayment sends a payment by fingerprint through rt, whose journal
// write of the outcome the server's process hook makes fail; calls
// restore; and sends the identical payment again, deliberately.
func secondPayment(t *testing.T, srv *chargeServer, rt http.RoundTripper, restore func()) {
	t.Helper()
	const body = `{"order":"o-4","amount":990}`
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first := post(ctx, rt, srv.URL, "", body)
	if first.err != nil || first.status != http.StatusOK || first.replay {
		t.Fatalf("first payment: %+v, want the charge's 200", first)
	}
	restore()
	sent := len(srv.keysOf(body))

	second := post(ctx, rt, srv.URL, "", body)
	keys := srv.keysOf(body)
	if second.err != nil {
		// Refusing is allowed, provided nothing was sent.
		if len(keys) != sent {
			t.Fatalf("second payment failed (%v) after sending %v", second.err, keys[sent:])
		}
		t.Logf("second payment refused before sending: %v", second.err)
		return
	}
	if second.replay || second.body == first.body {
		t.Fatalf("second deliberate payment answered with the first one's replay %q (replayed: %v; keys sent %v): two payments, one charge",
			second.body, second.replay, keys)
	}
	if srv.chargeCount() != 2 || keys[len(keys)-1] == keys[0] {
		t.Fatalf("second payment: %+v; %d charges, keys %v; want a second charge under a new key", second, srv.chargeCount(), keys)
	}
}
