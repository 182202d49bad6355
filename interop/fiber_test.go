package interop

// Fiber v2's idempotency middleware (github.com/gofiber/fiber/v2/middleware/
// idempotency), a third-party server nobody here wrote, behind a
// fault-injecting proxy of our own, its handler keeping a ledger of charges
// per order.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// fiberShop is a Fiber app with the idempotency middleware in its default
// configuration (it reads X-Idempotency-Key, wants 36 characters, keeps
// answers 30 minutes) in front of POST /orders, which charges the order
// named in its JSON body.
type fiberShop struct {
	url     string
	mu      sync.Mutex
	charges map[string]int
}

func newFiberShop(t *testing.T) *fiberShop {
	t.Helper()
	s := &fiberShop{charges: map[string]int{}}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(idempotency.New())
	app.Post("/orders", func(c *fiber.Ctx) error {
		var o struct {
			Order string `json:"order"`
		}
		if err := json.Unmarshal(c.Body(), &o); err != nil || o.Order == "" {
			return fiber.ErrBadRequest
		}
		s.mu.Lock()
		s.charges[o.Order]++
		n := s.charges[o.Order]
		s.mu.Unlock()
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"order": o.Order, "charge": fmt.Sprintf("ch_%s_%d", o.Order, n)})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.Shutdown(); <-done })
	s.url = "http://" + ln.Addr().String()
	return s
}

func (s *fiberShop) chargesOf(order string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges[order]
}

// fault is what the proxy does to one request.
type fault int

const (
	pass        fault = iota // forward it, forward the answer
	lostAnswer               // forward it, drop the connection instead of answering
	cutMidBody               // forward it, send the answer's headers and half its body, then reset
	unavailable              // answer 503 without forwarding it
	hold                     // forward it, tell held, answer nothing until the client goes
)

// faultProxy forwards requests to a server, doing to request n (from 1)
// what plan says.
type faultProxy struct {
	*httptest.Server
	mu     sync.Mutex
	n      int
	plan   func(n int) fault
	held   chan struct{}
	fwd    *http.Client
	status []int // the server's status for each forwarded request
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	own := &http.Transport{}
	p := &faultProxy{plan: func(int) fault { return pass }, held: make(chan struct{}, 1), fwd: &http.Client{Transport: own}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.n++
		f := p.plan(p.n)
		p.mu.Unlock()
		if f == unavailable {
			write(w, http.StatusServiceUnavailable, "upstream unavailable\n", "Content-Type", "text/plain")
			return
		}
		out, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		out.Header = r.Header.Clone()
		resp, err := p.fwd.Do(out)
		if err != nil {
			hijackAndClose(w, false)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		p.mu.Lock()
		p.status = append(p.status, resp.StatusCode)
		p.mu.Unlock()
		switch f {
		case lostAnswer:
			hijackAndClose(w, false)
			return
		case hold:
			p.held <- struct{}{}
			<-r.Context().Done()
			return
		}
		for k, vv := range resp.Header {
			w.Header()[k] = vv
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		w.WriteHeader(resp.StatusCode)
		if f == cutMidBody {
			w.Write(answer[:len(answer)/2])
			w.(http.Flusher).Flush()
			hijackAndClose(w, true)
			return
		}
		w.Write(answer)
	}))
	t.Cleanup(func() { p.Close(); own.CloseIdleConnections() })
	return p
}

// setPlan replaces the plan; request numbers go on from where they are.
func (p *faultProxy) setPlan(plan func(n int) fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.n
	p.plan = func(n int) fault { return plan(n - start) }
}

func (p *faultProxy) requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *faultProxy) statuses() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.status...)
}

// first returns a plan that does fs to the first requests, then passes.
func first(fs ...fault) func(int) fault {
	return func(n int) fault {
		if n >= 1 && n <= len(fs) {
			return fs[n-1]
		}
		return pass
	}
}

func order(id string) string { return `{"order":"` + id + `","amount":100}` }

// pay sends order id through tr as the action "pay:"+id; the app's rule
// for a body that fails to arrive is to send the same action again, which
// it does up to twice. It returns the status and the body of the answer it
// read whole.
func pay(t *testing.T, tr http.RoundTripper, url, id string) (int, string, *http.Response) {
	t.Helper()
	for try := 0; try < 3; try++ {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(bg, "pay:"+id), url+"/orders", order(id)))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			return resp.StatusCode, string(b), resp
		}
		t.Logf("order %s: the answer's body failed (%v): sending the action again", id, err)
	}
	t.Fatalf("order %s: no whole answer in three sends", id)
	return 0, "", nil
}

// Through lost answers, a reset mid-body and a 503 burst, idemretry set to
// Fiber's header (WithKeyHeader("X-Idempotency-Key")) charges each order
// once; with idemretry's default header Fiber sees no key, and every fault
// after the charge charges again. Fiber's replay carries nothing that marks
// it (IsReplay is false): a client
// cannot tell a server that ignores its key from one that honours it, so
// idemretry does not try to warn of it.
func TestFiberFaultsOneChargePerOrder(t *testing.T) {
	shop := newFiberShop(t)
	proxy := newFaultProxy(t, shop.url)
	faults := []struct {
		name string
		plan []fault
	}{
		{"answer lost after the charge", []fault{lostAnswer, lostAnswer}},
		{"reset mid-body", []fault{cutMidBody}},
		{"503 burst", []fault{unavailable, unavailable, unavailable}},
		{"503, then the answer lost", []fault{unavailable, lostAnswer}},
	}
	for _, header := range []string{"X-Idempotency-Key", "Idempotency-Key"} {
		tr, _ := newTransport(t, nil, idemretry.WithKeyHeader(header), idemretry.WithBackOff(noWait), idemretry.WithRetryBudget(0, 0))
		for i, f := range faults {
			id := fmt.Sprintf("%s-%d", header, i)
			proxy.setPlan(first(f.plan...))
			status, body, resp := pay(t, tr, proxy.URL, id)
			assert.Equal(t, http.StatusCreated, status, "%s", f.name)
			assert.False(t, idemretry.IsReplay(resp), "Fiber marks no replay")
			t.Logf("header %-17s %-28s: charged %d (answer %s)", header, f.name, shop.chargesOf(id), body)
			switch {
			case header == "X-Idempotency-Key", f.name == "503 burst":
				assert.Equal(t, 1, shop.chargesOf(id), "%s, %s: one charge", header, f.name)
			default:
				assert.Greater(t, shop.chargesOf(id), 1, "%s, %s: Fiber ignores the key, each resend charges", header, f.name)
			}
		}
	}
}

// Fiber's middleware validates the key's length (36, a UUID's) and answers
// 500 to anything else: the quoted form "…" (38) is refused on every
// attempt, and idemretry retries the 500 to the end of its attempts. No
// charge, and no hint that the key's form is what is wrong.
func TestFiberRefusesTheQuotedKey(t *testing.T) {
	shop := newFiberShop(t)
	proxy := newFaultProxy(t, shop.url)
	tr, _ := newTransport(t, nil, idemretry.WithKeyHeader("X-Idempotency-Key"), idemretry.WithQuotedKey(),
		idemretry.WithBackOff(noWait), idemretry.WithRetryBudget(0, 0))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(bg, "pay:quoted"), proxy.URL+"/orders", order("quoted")))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("quoted key: %d requests, status %d %q, charged %d", proxy.requests(), resp.StatusCode, b, shop.chargesOf("quoted"))
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted)
	assert.Equal(t, 6, proxy.requests())
	assert.Equal(t, 0, shop.chargesOf("quoted"))
}

// TestFiberKilledClientChild is the app of TestFiberKilledClientRestarted:
// one order through idemretry set to Fiber's header, with a file journal.
func TestFiberKilledClientChild(t *testing.T) {
	childOnly(t, "TestFiberKilledClientChild")
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(os.Getenv(envDir)), idemretry.WithKeyHeader("X-Idempotency-Key"))
	require.NoError(t, err)
	defer tr.Close()
	status, body, _ := pay(t, tr, os.Getenv(envURL), "K-1")
	require.Equal(t, http.StatusCreated, status)
	fmt.Println("paid", body)
}

// The client is SIGKILLed after Fiber charged, before the answer reached
// it, and restarted on its journal: it sends the order again under the
// journaled key, Fiber replays the stored answer, one charge.
func TestFiberKilledClientRestarted(t *testing.T) {
	shop := newFiberShop(t)
	proxy := newFaultProxy(t, shop.url)
	proxy.setPlan(first(hold))
	dir := t.TempDir()
	cmd, out := startChild(t, "TestFiberKilledClientChild", proxy.URL, dir)
	select {
	case <-proxy.held:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the first run never reached the server:\n%s", out)
	}
	require.Equal(t, 1, shop.chargesOf("K-1"), "charged before the kill")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	cmd, out = startChild(t, "TestFiberKilledClientChild", proxy.URL, dir)
	require.NoError(t, cmd.Wait(), "the restarted app:\n%s", out)
	assert.Contains(t, out.String(), `paid {"charge":"ch_K-1_1","order":"K-1"}`, "Fiber's stored answer")
	assert.Equal(t, 1, shop.chargesOf("K-1"))
	assert.Equal(t, []int{201, 201}, proxy.statuses())
}
