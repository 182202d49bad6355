package sqljournal_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/sqljournal"
)

// Two machines (two Transports, each with its own pool and Journal on one
// table, B one that does not lease actions) send one payment action, over real HTTP, to a server that
// processes the first request slowly and answers a concurrent one with the
// same key 409. A gets 200 and records done; B, which got the 409 and is
// waiting to retry, is cancelled and records its stale "pending". Done is
// final: the record stays done. For an action named by its fingerprint, a
// deliberate identical payment afterwards is a new action: a new key, and
// the server charges it (before the fix it reused the old key and was
// answered with the first payment's replay).
func TestTwoMachinesStaleFinishKeepsDone(t *testing.T) {
	for _, tc := range []struct{ name, action string }{
		{"WithAction", "pay:order-77"},
		{"Fingerprint", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			staleFinish(t, tc.action)
		})
	}
}

func staleFinish(t *testing.T, action string) {
	const body = `{"order":77,"amount":1200}`
	probe := testDB(t)
	table := newTable(t, probe)
	open := func() *sqljournal.Journal { return openOn(t, testDB(t), table) }

	srv := newChargeServer(t)
	inflight, gate := make(chan string, 1), make(chan struct{})
	srv.process = func(n int, r *http.Request) {
		if n == 1 { // A's charge: slow, until B has been answered 409
			inflight <- r.Header.Get("Idempotency-Key")
			<-gate
		}
	}
	a := transportOn(t, open())
	waiting := make(chan struct{}, 1)
	// B does not lease actions (an older version, or a journal without
	// leases): it sends while A is in flight, and is answered 409.
	b := transportOn(t, noLease{open()},
		// B waits long after its 409, long enough to be cancelled while waiting.
		idemretry.WithBackOff(func() backoff.BackOff { return backoff.NewConstantBackOff(10 * time.Minute) }),
		idemretry.WithObserver(func(ev idemretry.Event) {
			if ev.Kind == idemretry.EventRetry && ev.Status == http.StatusConflict {
				select {
				case waiting <- struct{}{}:
				default:
				}
			}
		}))

	resA := make(chan payment, 1)
	go func() { resA <- post(context.Background(), a, srv.URL, action, body) }()
	var key string
	select {
	case key = <-inflight:
	case <-time.After(30 * time.Second):
		t.Fatal("A's request never reached the server")
	}
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	resB := make(chan payment, 1)
	go func() { resB <- post(ctxB, b, srv.URL, action, body) }()
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		close(gate)
		t.Fatal("B was never answered 409")
	}
	// B records its attempt before it waits (attempts 1): let that land
	// first, so that what follows is the cancelled waiter's finish.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if rows := rowsOf(t, probe, table); len(rows) == 1 && rows[0].attempts == 1 {
			break
		}
		if time.Now().After(deadline) {
			close(gate)
			t.Fatalf("B's attempt was never recorded: %+v", rowsOf(t, probe, table))
		}
	}
	close(gate)
	pa := <-resA
	if pa.err != nil || pa.status != http.StatusOK || pa.replay {
		t.Fatalf("A: %+v, want the charge's 200", pa)
	}
	rows := rowsOf(t, probe, table)
	if len(rows) != 1 || rows[0].key != key || rows[0].state != journal.StateDone || rows[0].status != http.StatusOK {
		t.Fatalf("after A: %+v, want one done record with status 200 under %s", rows, key)
	}

	// B, waiting to retry under the same key, gives up: its finish is stale.
	cancelB()
	var pb payment
	select {
	case pb = <-resB:
	case <-time.After(30 * time.Second):
		t.Fatal("B did not return after its context was cancelled")
	}
	if !errors.Is(pb.err, context.Canceled) {
		t.Fatalf("B: %+v, want context.Canceled", pb)
	}
	rows = rowsOf(t, probe, table)
	if len(rows) != 1 || rows[0].key != key || rows[0].state != journal.StateDone || rows[0].status != http.StatusOK {
		t.Fatalf("after B's stale finish: %+v, want the done record (status 200, key %s) kept", rows, key)
	}

	// The action again, from B.
	again := post(context.Background(), b, srv.URL, action, body)
	if again.err != nil || again.status != http.StatusOK {
		t.Fatalf("payment again: %+v", again)
	}
	keys := srv.keysOf(body)
	last := keys[len(keys)-1]
	if action != "" {
		// A named action keeps its key: the server replays its answer.
		if !again.replay || again.body != pa.body || last != key || srv.chargeCount() != 1 {
			t.Fatalf("named action again: %+v under %s (%d charges), want the replay of %q under %s, one charge",
				again, last, srv.chargeCount(), pa.body, key)
		}
		return
	}
	// A deliberate identical payment by fingerprint is a new action.
	if again.replay || again.body == pa.body || last == key || srv.chargeCount() != 2 {
		t.Fatalf("deliberate repeat: %+v under %s (%d charges), want a new charge under a new key (the first was %s, %q)",
			again, last, srv.chargeCount(), key, pa.body)
	}
}

// noLease is a journal.Journal without the Leaser capability of the one
// it wraps: a machine that does not lease actions.
type noLease struct{ journal.Journal }
