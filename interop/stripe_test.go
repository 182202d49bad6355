package interop

// stripe-go over idemretry against a local server that speaks Stripe's wire
// shapes: form-encoded POSTs, JSON objects and errors, Idempotency-Key
// semantics and Idempotent-Replayed.

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemretry/idemretry"
)

func paymentIntent(c int) string {
	return fmt.Sprintf(`{"id":"pi_%d","object":"payment_intent","amount":100,"currency":"usd","status":"requires_payment_method"}`, c)
}

var paymentParams = func() *stripe.PaymentIntentCreateParams {
	return &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(100), Currency: stripe.String(stripe.CurrencyUSD)}
}

// stripe-go with MaxNetworkRetries 0 over idemretry, a named action: a
// 503, then a charge whose answer is lost, then the server's replay. One
// key (stripe-go's own, which idemretry keeps on every attempt), one
// charge, and stripe-go returns the charged PaymentIntent.
func TestStripeOverIdemretry(t *testing.T) {
	srv := newLedgerServer(t, paymentIntent)
	srv.faults(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			write(w, http.StatusServiceUnavailable, "Service Unavailable\n", "Content-Type", "text/plain")
			return true
		}
		return false
	}, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 2 {
			hijackAndClose(w, false)
			return true
		}
		return false
	})
	tr, _ := newTransport(t, nil, idemretry.WithBackOff(noWait), idemretry.WithRequireAction())
	sc := stripeClient(srv.URL, &http.Client{Transport: tr}, 0)
	pi, err := sc.V1PaymentIntents.Create(idemretry.WithAction(bg, "pay:order-A-1"), paymentParams())
	require.NoError(t, err)
	assert.Equal(t, "pi_1", pi.ID)
	keys := srv.seenKeys()
	require.Len(t, keys, 3)
	assert.Len(t, unique(keys), 1)
	assert.NotEmpty(t, keys[0])
	assert.Equal(t, 1, srv.chargeCount())
}

// A Stripe-shaped 503 (a JSON error, no Stripe-Should-Retry): stripe-go
// alone sends it once (its typed API errors are retried only for a 429
// lock_timeout, whatever the status), idemretry retries it as every 503
// (6 requests under one key, safe with the key); a Stripe-Should-Retry:
// false makes it final for idemretry too. A plain-text 503, which stripe-go
// cannot parse, stripe-go retries (3 requests).
func TestStripeShaped503(t *testing.T) {
	const stripe503 = `{"error":{"type":"api_error","message":"The service is temporarily unavailable."}}`
	cases := []struct {
		name      string
		answer    func(int, http.ResponseWriter, *http.Request)
		idemretry bool
		want      int
	}{
		{"stripe-go alone, JSON 503", always(503, stripe503, "Content-Type", "application/json"), false, 1},
		{"stripe-go alone, plain-text 503", always(503, "Service Unavailable\n", "Content-Type", "text/plain"), false, 3},
		{"over idemretry, JSON 503", always(503, stripe503, "Content-Type", "application/json"), true, 6},
		{"over idemretry, JSON 503, Stripe-Should-Retry: false", always(503, stripe503, "Content-Type", "application/json", "Stripe-Should-Retry", "false"), true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newWire(t, c.answer)
			hc := &http.Client{Transport: &http.Transport{}}
			defer hc.CloseIdleConnections()
			retries := stripe.DefaultMaxNetworkRetries
			if c.idemretry {
				tr, _ := newTransport(t, nil, idemretry.WithBackOff(noWait))
				hc, retries = &http.Client{Transport: tr}, 0
			}
			_, err := stripeClient(srv.URL, hc, retries).V1PaymentIntents.Create(idemretry.WithAction(bg, "pay:503"), paymentParams())
			require.Error(t, err)
			t.Logf("%s: %d requests", c.name, srv.requests())
			assert.Equal(t, c.want, srv.requests())
			assert.Len(t, unique(srv.seenKeys()), 1)
		})
	}
}

// TestStripeKeyAcrossRestartChild is the app of TestStripeKeyAcrossRestart:
// one payment through stripe-go over idemretry with a file journal, named
// by its action, logging at Debug (which says when the key stripe-go set
// is replaced by the action's).
func TestStripeKeyAcrossRestartChild(t *testing.T) {
	childOnly(t, "TestStripeKeyAcrossRestartChild")
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(os.Getenv(envDir)), idemretry.WithLogger(log))
	require.NoError(t, err)
	defer tr.Close()
	sc := stripeClient(os.Getenv(envURL), &http.Client{Transport: tr}, 0)
	pi, err := sc.V1PaymentIntents.Create(idemretry.WithAction(bg, "pay:order-R-1"), paymentParams())
	require.NoError(t, err)
	fmt.Println("paid", pi.ID)
}

// The app is SIGKILLed after the server charged, before the answer came
// back, and restarted on its journal: it calls stripe-go again for the same
// action, stripe-go mints a new Idempotency-Key, and the server must still
// see the journaled key (the action's first), and charge once. Restarted
// again once the action is done, it gets the replay under that key too.
// (Issue 29 item 1: the key stripe-go minted named the action, so the
// restart was a new action, and charged again.)
func TestStripeKeyAcrossRestart(t *testing.T) {
	charged := make(chan struct{})
	srv := newLedgerServer(t, paymentIntent)
	srv.faults(nil, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			close(charged)
			<-r.Context().Done() // the answer never leaves: the client dies first
			return true
		}
		return false
	})
	dir := t.TempDir()
	cmd, out := startChild(t, "TestStripeKeyAcrossRestartChild", srv.URL, dir)
	select {
	case <-charged:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the first run never reached the server:\n%s", out)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	for run := 2; run <= 3; run++ {
		cmd, out = startChild(t, "TestStripeKeyAcrossRestartChild", srv.URL, dir)
		require.NoError(t, cmd.Wait(), "run %d of the app:\n%s", run, out)
		assert.Contains(t, out.String(), "paid pi_1\n", "run %d gets the first charge's replay", run)
		keys := srv.seenKeys()
		t.Logf("run %d: keys the server saw: %q; charges: %d", run, keys, srv.chargeCount())
		require.Len(t, keys, run)
		assert.Equal(t, keys[0], keys[run-1], "run %d sends the action's journaled key", run)
		// stripe-go minted a key of its own for this run's call; idemretry
		// sent the action's in its place.
		m := replacedKey.FindStringSubmatch(out.String())
		require.NotNil(t, m, "run %d logged no replaced key:\n%s", run, out)
		assert.Equal(t, keys[0], m[1])
		assert.NotEqual(t, keys[0], m[2], "stripe-go's own key for run %d", run)
	}
	assert.Equal(t, 1, srv.chargeCount())
}

// replacedKey matches idemretry's Debug line for a request whose key is
// replaced by its action's: the action's key, then the request's.
var replacedKey = regexp.MustCompile(`msg="idemretry: the request's key replaced by its action's" action=pay:order-R-1 key=(\S+) request_key=(\S+)`)
