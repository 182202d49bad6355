package sqljournal_test

// A named action's large body across a fleet sharing one PostgreSQL
// journal. sqljournal keeps no fingerprint secret (it is no
// journal.FingerprintKeeper), so its rows hold plain SHA-256 fingerprints
// whatever the machine's CPU: a keyed one, whose key no other machine
// would share, must never reach the table. Every machine checks another's
// record from the row it reads back. Ported from the review of hF2.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
)

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
