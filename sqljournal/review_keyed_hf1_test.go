package sqljournal_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
)

// A large named payment (a plain fingerprint: sqljournal keeps no secret)
// sent by two machines sharing one table, while the first one's
// charge is in progress: the second waits for the first's lease, reads the
// record again and sends under the first's key (one charge, one key), and
// a third request of the action with another body is refused with
// ErrFingerprintMismatch, with nothing sent.
func TestReviewLargeNamedPaymentTwoMachinesLeased(t *testing.T) {
	srv := newUnstartedChargeServer(t)
	inProgress, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv.process = func(n int, _ *http.Request) {
		if n == 1 {
			once.Do(func() { close(inProgress) })
			<-release
		}
	}
	srv.Start()
	probe := testDB(t)
	table := newTable(t, probe)
	a, b := machine(t, table), machine(t, table)
	line := `{"order":"big-1","amount":1000}` + "\n"
	body := strings.Repeat(line, (4<<16+999)/len(line))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	first := make(chan payment, 1)
	go func() { first <- post(ctx, a, srv.URL, "pay:big-1", body) }()
	<-inProgress
	second := make(chan payment, 1)
	go func() { second <- post(ctx, b, srv.URL, "pay:big-1", body) }()
	// The other body on a third machine: on B it could reach B's flight of
	// the action before B's own request does (the goroutine above is not
	// ordered with it), and B's request would then be refused against it, as
	// guarantee 9 has a request refused against the one in flight first.
	other := post(ctx, machine(t, table), srv.URL, "pay:big-1", body[:len(body)-1]+"X")
	if !errors.Is(other.err, idemretry.ErrFingerprintMismatch) {
		t.Errorf("another body under the action: %d %v, want ErrFingerprintMismatch", other.status, other.err)
	}
	time.Sleep(200 * time.Millisecond) // machine B waits for A's lease
	close(release)
	p1, p2 := <-first, <-second
	if p1.err != nil || p2.err != nil || p1.body != p2.body {
		t.Errorf("machine A: %d %q %v; machine B: %d %q %v: want one answer", p1.status, p1.body, p1.err, p2.status, p2.body, p2.err)
	}
	if n := srv.chargeCount(); n != 1 {
		t.Errorf("%d charges", n)
	}
	keys := srv.keysOf(body)
	for _, k := range keys {
		if k != keys[0] {
			t.Errorf("the payment arrived under keys %v, want one", keys)
			break
		}
	}
	if n := len(srv.keysOf(body[:len(body)-1] + "X")); n != 0 {
		t.Errorf("the other body was sent %d times", n)
	}
}
