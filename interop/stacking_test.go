package interop

// Retrying clients stacked with idemretry: go-retryablehttp as its base,
// resty above it.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/go-resty/resty/v2"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
)

// retryableBase is go-retryablehttp as idemretry's base, its own retries
// off (RetryMax = 0), with its default ErrorHandler or with
// PassthroughErrorHandler.
func retryableBase(t *testing.T, passthrough bool) http.RoundTripper {
	rc := retryablehttp.NewClient()
	rc.RetryMax = 0
	rc.Logger = nil
	if passthrough {
		rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	}
	t.Cleanup(rc.HTTPClient.CloseIdleConnections)
	return &retryablehttp.RoundTripper{Client: rc}
}

// Under go-retryablehttp as the base, RetryMax = 0 is not enough: its
// default ErrorHandler turns every answer its CheckRetry would retry into
// an error, so idemretry sees a transport error where the server said
// more. Measured: X-Should-Retry: false is ignored (6 requests instead of
// 1); the Retry-After: 1 is lost (idemretry waits nothing instead of 1 s before
// each retry); the status reads 0 instead of 503. PassthroughErrorHandler hands
// the answer over, and idemretry reads it as the server meant it.
func TestRetryableHTTPBaseNeedsPassthroughErrorHandler(t *testing.T) {
	for _, passthrough := range []bool{false, true} {
		name := "default ErrorHandler"
		if passthrough {
			name = "PassthroughErrorHandler"
		}
		t.Run(name, func(t *testing.T) {
			// X-Should-Retry: false on a 503 ends the retries.
			srv := newWire(t, always(http.StatusServiceUnavailable, `{"error":"overloaded"}`, "Content-Type", "application/json", "X-Should-Retry", "false"))
			tr, _ := newTransport(t, retryableBase(t, passthrough), idemretry.WithBackOff(noWait))
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(bg, "pay:hint"), srv.URL, `{"amount":1}`))
			hinted := srv.requests()
			if passthrough {
				require.NoError(t, err)
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
				resp.Body.Close()
				assert.Equal(t, 1, hinted, "X-Should-Retry: false is final")
			} else {
				var ae *idemretry.ActionError
				require.ErrorAs(t, err, &ae)
				assert.Equal(t, 6, hinted, "the hint never reaches idemretry")
				assert.Equal(t, 0, ae.Status, "nor the status")
			}

			// Retry-After: 1 on a 503 is a floor on each wait.
			srv = newWire(t, always(http.StatusServiceUnavailable, "busy", "Retry-After", "1"))
			tr, clk := newTransport(t, retryableBase(t, passthrough), idemretry.WithBackOff(noWait), idemretry.WithMaxRetries(3))
			resp, err = tr.RoundTrip(post(t, idemretry.WithAction(bg, "pay:ra"), srv.URL, `{"amount":1}`))
			if err == nil {
				resp.Body.Close()
			}
			t.Logf("%s: X-Should-Retry false: %d requests; Retry-After 1: %d requests, idemretry's waits %v", name, hinted, srv.requests(), clk.Waits())
			if passthrough {
				assert.Equal(t, []time.Duration{time.Second, time.Second, time.Second}, clk.Waits())
			} else {
				assert.Empty(t, clk.Waits(), "no wait at all: the drawn waits are 0 and the Retry-After never arrives")
			}
			assert.Equal(t, 4, srv.requests())
		})
	}
}

// cutBodyServer is the shared payment server (internal/paytest): it
// charges each new key once (an unkeyed request always) and stores the
// answer; the first answer of all is cut mid-body: its headers and half
// its body are sent, then the connection is reset. A known key gets the
// stored answer whole.
type cutBodyServer struct {
	*httptest.Server
	pay *paytest.Server
}

func cutBodyAnswer(c paytest.Charge) []byte {
	return fmt.Appendf(nil, `{"charge":%q,"padding":"%0512d"}`, c.ID, 0)
}

func newCutBodyServer(t *testing.T) *cutBodyServer {
	s := &cutBodyServer{}
	s.pay = paytest.New(paytest.WithKeylessCharges(), paytest.WithStatus(http.StatusOK), paytest.WithAnswerBody(cutBodyAnswer),
		paytest.WithAfterCharge(func(n int, w http.ResponseWriter, _ *http.Request) bool {
			if n != 1 {
				return false
			}
			body := cutBodyAnswer(s.pay.Charges()[0])
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			w.Write(body[:len(body)/2])
			w.(http.Flusher).Flush()
			hijackAndClose(w, true)
			return true
		}))
	s.Server = httptest.NewServer(s.pay)
	t.Cleanup(s.Close)
	return s
}

func (s *cutBodyServer) chargeCount() int { return len(s.pay.Charges()) }

// seenKeys returns the key of every request, in order ("" for none).
func (s *cutBodyServer) seenKeys() []string {
	var out []string
	for _, r := range s.pay.Requests() {
		out = append(out, r.Header.Get(paytest.KeyHeader))
	}
	return out
}

// A client above idemretry that retries a body-read error (resty, with
// any retries) double-charges an unnamed payment whose 200 was cut
// mid-body: idemretry returned the final answer and recorded the action
// done, so resty's identical retry is a deliberate repeat, with a new key.
// Named (WithAction), the retry is the same action: same key, the server's
// replay, one charge.
func TestRestyBodyReadRetryNeedsNamedAction(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "unnamed", true: "WithAction"}[named], func(t *testing.T) {
			srv := newCutBodyServer(t)
			tr, _ := newTransport(t, nil, idemretry.WithBackOff(noWait))
			rc := resty.NewWithClient(&http.Client{Transport: tr}).SetRetryCount(1).SetRetryWaitTime(time.Millisecond)
			ctx := bg
			if named {
				ctx = idemretry.WithAction(bg, "pay:order-cut")
			}
			resp, err := rc.R().SetContext(ctx).SetHeader("Content-Type", "application/json").SetBody(`{"amount":100}`).Post(srv.URL + "/payments")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode())
			keys := srv.seenKeys()
			t.Logf("named=%v: %d requests, %d distinct keys, %d charges", named, len(keys), len(unique(keys)), srv.chargeCount())
			require.Len(t, keys, 2, "the cut answer, then resty's retry")
			if named {
				assert.Equal(t, keys[0], keys[1])
				assert.Equal(t, 1, srv.chargeCount())
				assert.Equal(t, "true", resp.Header().Get("Idempotent-Replayed"))
			} else {
				assert.NotEqual(t, keys[0], keys[1], "a repeat after a done action is a new action")
				assert.Equal(t, 2, srv.chargeCount(), "the double charge WithAction prevents")
			}
		})
	}
}
