package payments

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestServer starts a server with a fast clock and the given faults.
func newTestServer(t *testing.T, faults FaultPlan, mod func(*ServerConfig)) *Server {
	t.Helper()
	clk := NewClock(10)
	cfg := ServerConfig{Clock: clk, Epoch: clk.Now(), Faults: faults,
		ProcessTime: 10 * time.Millisecond, SlowTime: 3 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s := NewServer(cfg)
	t.Cleanup(s.Close)
	return s
}

// post sends one charge on a fresh connection, so that net/http never
// resends it by itself.
func post(t *testing.T, s *Server, path, key, body string) (*http.Response, string, error) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, s.URL()+path, io.NopCloser(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

const chargeA = `{"intent":"pi_a","amount":100}`

func only(intent string, f Fault) FaultPlan {
	return func(in string, n int) Fault {
		if in == intent && n == 0 {
			return f
		}
		return NoFault
	}
}

func TestServerReplaysStoredAnswer(t *testing.T) {
	s := newTestServer(t, nil, nil)
	r1, b1, err := post(t, s, ChargesPath, "k1", chargeA)
	if err != nil || r1.StatusCode != 200 || r1.Header.Get(ReplayedHeader) != "" {
		t.Fatalf("first: %v %v", r1, err)
	}
	r2, b2, err := post(t, s, ChargesPath, "k1", chargeA)
	if err != nil || r2.StatusCode != 200 || r2.Header.Get(ReplayedHeader) != "true" || b2 != b1 {
		t.Fatalf("second: status %v replayed %q body %q want %q, %v", r2.StatusCode, r2.Header.Get(ReplayedHeader), b2, b1, err)
	}
	if got := s.Charges()["pi_a"]; got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
}

func TestServerReplaysStored500(t *testing.T) {
	s := newTestServer(t, only("pi_a", Error500), nil)
	for i, want := range []string{"", "true"} {
		r, _, err := post(t, s, ChargesPath, "k1", chargeA)
		if err != nil || r.StatusCode != 500 || r.Header.Get(ReplayedHeader) != want {
			t.Fatalf("request %d: %v %v", i, r, err)
		}
	}
	if got := s.Charges()["pi_a"]; got != 0 {
		t.Fatalf("charges = %d, want 0", got)
	}
}

func TestServerConflictWhileInFlight(t *testing.T) {
	s := newTestServer(t, only("pi_a", Slow), nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the slow first request
		defer wg.Done()
		post(t, s, ChargesPath, "k1", chargeA)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(s.Log()) == 0 && s.inflight.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	r, _, err := post(t, s, ChargesPath, "k1", chargeA)
	if err != nil || r.StatusCode != http.StatusConflict {
		t.Fatalf("same key in flight: %v %v, want 409", r, err)
	}
	wg.Wait()
	if r, _, _ := post(t, s, ChargesPath, "k1", chargeA); r.StatusCode != 200 || r.Header.Get(ReplayedHeader) != "true" {
		t.Fatalf("after the first finished: %v, want a replayed 200", r)
	}
	if got := s.Charges()["pi_a"]; got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
}

func TestServerRejectsOtherPayloadUnderKey(t *testing.T) {
	s := newTestServer(t, nil, nil)
	post(t, s, ChargesPath, "k1", chargeA)
	r, _, err := post(t, s, ChargesPath, "k1", `{"intent":"pi_a","amount":999}`)
	if err != nil || r.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("other payload: %v %v, want 422", r, err)
	}
}

func TestServerRequiresKeyButLegacyDoesNot(t *testing.T) {
	s := newTestServer(t, nil, nil)
	if r, _, err := post(t, s, ChargesPath, "", chargeA); err != nil || r.StatusCode != http.StatusBadRequest {
		t.Fatalf("no key: %v %v, want 400", r, err)
	}
	for range 2 {
		if r, _, err := post(t, s, LegacyChargesPath, "", chargeA); err != nil || r.StatusCode != 200 {
			t.Fatalf("legacy: %v %v", r, err)
		}
	}
	if got := s.Charges()["pi_a"]; got != 2 {
		t.Fatalf("legacy charges = %d, want 2: nothing dedupes keyless charges", got)
	}
}

func TestServerDropCommitsThenCuts(t *testing.T) {
	s := newTestServer(t, only("pi_a", Drop), nil)
	if _, _, err := post(t, s, ChargesPath, "k1", chargeA); err == nil {
		t.Fatal("dropped request answered")
	}
	if got := s.Charges()["pi_a"]; got != 1 {
		t.Fatalf("charges = %d, want 1 (committed before the cut)", got)
	}
	if r, _, _ := post(t, s, ChargesPath, "k1", chargeA); r.StatusCode != 200 || r.Header.Get(ReplayedHeader) != "true" {
		t.Fatalf("resend: %v, want the stored answer", r)
	}
}

func TestServerOutageAndCapacity(t *testing.T) {
	s := newTestServer(t, nil, func(c *ServerConfig) {
		c.Outage = Outage{Start: 0, End: time.Hour}
	})
	if r, _, _ := post(t, s, ChargesPath, "k1", chargeA); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("in outage: %v, want 503", r)
	}

	s = newTestServer(t, only("pi_a", Slow), func(c *ServerConfig) { c.Capacity = 1 })
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(t, s, ChargesPath, "k1", chargeA)
	}()
	for s.inflight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	r, _, _ := post(t, s, ChargesPath, "k2", `{"intent":"pi_b","amount":100}`)
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("over capacity: %v, want 429 with Retry-After: 1", r)
	}
	<-done
	// Turned away unprocessed, the key is free again.
	if r, _, _ := post(t, s, ChargesPath, "k2", `{"intent":"pi_b","amount":100}`); r.StatusCode != 200 || r.Header.Get(ReplayedHeader) != "" {
		t.Fatalf("after capacity freed: %v, want a fresh 200", r)
	}
}

// The ledger the checks count from: each request's key, whether it
// charged, whether it was replayed. A payment cut after its charge and
// resent under its key counts as resent under its old key; one resent
// under a new key is charged again and does not.
func TestServerLedgerShowsResendUnderOldKey(t *testing.T) {
	s := newTestServer(t, func(intent string, n int) Fault {
		if n == 0 {
			return Drop
		}
		return NoFault
	}, nil)
	chargeB := `{"intent":"pi_b","amount":100}`
	for _, q := range []struct{ key, body string }{
		{"k1", chargeA}, {"k1", chargeA}, // cut, then the same key: replayed
		{"k2", chargeB}, {"k3", chargeB}, // cut, then a new key: charged again
	} {
		post(t, s, ChargesPath, q.key, q.body)
	}
	log := s.Log()
	if len(log) != 4 {
		t.Fatalf("ledger has %d requests, want 4: %+v", len(log), log)
	}
	want := []Request{
		{Intent: "pi_a", Key: "k1", Status: StatusDropped, Charged: true},
		{Intent: "pi_a", Key: "k1", Status: 200, Replayed: true},
		{Intent: "pi_b", Key: "k2", Status: StatusDropped, Charged: true},
		{Intent: "pi_b", Key: "k3", Status: 200, Charged: true},
	}
	// The ledger is in order of completion: a cut request's handler may
	// log after the resend it provoked. Compare without the order.
	type entry struct {
		intent, key       string
		status            int
		replayed, charged bool
	}
	got := map[entry]int{}
	for _, q := range log {
		got[entry{q.Intent, q.Key, q.Status, q.Replayed, q.Charged}]++
	}
	for _, w := range want {
		e := entry{w.Intent, w.Key, w.Status, w.Replayed, w.Charged}
		if got[e] == 0 {
			t.Errorf("ledger lacks %+v: %+v", w, log)
		}
		got[e]--
	}
	if got := resentUnderOldKey(log); !got["pi_a"] || got["pi_b"] {
		t.Errorf("resent under old key: %v, want pi_a only", got)
	}
	if c, f := s.Charges(), s.Faulted(); c["pi_a"] != 1 || c["pi_b"] != 2 || !f["pi_a"] || !f["pi_b"] || len(f) != 2 {
		t.Errorf("charges %v, faulted %v; want pi_a 1, pi_b 2, both faulted", c, f)
	}
}
