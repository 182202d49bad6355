package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemretry/idemretry"
)

// Names of the compared clients, baseline first.
const (
	NetHTTP         = "nethttp"
	IdemMemory      = "idemretry-memory"
	IdemFile        = "idemretry-file"
	RetryableHTTP   = "retryablehttp"
	Failsafe        = "failsafe"
	FailsafeNoClose = "failsafe-noclose" // failsafe as configured out of the box; tests only
	// The peers as a payment client must use them: with an
	// Idempotency-Key of the caller's, minted per action (UUIDv4) and set
	// on the request, which each peer's retries send again.
	RetryableHTTPKey = "retryablehttp+key"
	FailsafeKey      = "failsafe+key"
)

// Names lists the clients every benchmark compares, baseline first.
var Names = []string{NetHTTP, IdemMemory, IdemFile, RetryableHTTP, Failsafe}

// KeyedPeerNames lists the peers that set a key by hand, which the 1 KiB
// POST case also runs: the like-for-like comparison for a payment client,
// whose every request carries a key on the wire.
var KeyedPeerNames = []string{RetryableHTTPKey, FailsafeKey}

// maxRetries is the same retry budget for every retrying client.
const maxRetries = 5

// Client is one of the compared clients, ready to send.
type Client struct {
	Name string
	HTTP *http.Client
	// Keyed is true for idemretry: each request must carry a new action id
	// (WithAction), which is how an application uses it.
	Keyed bool
	// HandKey: Post mints a key per action and sets it on the request
	// (KeyedPeerNames).
	HandKey bool
	close   func() error
}

// Close releases the client's connections and journal.
func (c *Client) Close() error { return c.close() }

// newBase returns the RoundTripper every client sends through: its own
// clone of http.DefaultTransport, with enough idle connections per host
// that RunParallel does not measure connection churn.
func newBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.MaxIdleConnsPerHost = 64
	return t
}

// zeroBackOff makes idemretry retry at once, like the peers below.
func zeroBackOff() backoff.BackOff { return &backoff.ZeroBackOff{} }

// NewClient builds the named client over loopback TCP. dir is where
// idemretry-file keeps its journal; it must be empty and private to this
// client.
func NewClient(name, dir string) (*Client, error) { return newClient(name, dir, newBase()) }

// newClient builds the named client over base.
func newClient(name, dir string, base http.RoundTripper) (*Client, error) {
	c := &Client{Name: name, close: func() error {
		if t, ok := base.(interface{ CloseIdleConnections() }); ok {
			t.CloseIdleConnections()
		}
		return nil
	}}
	switch name {
	case NetHTTP:
		c.HTTP = &http.Client{Transport: base}
	case IdemMemory, IdemFile:
		opt := idemretry.WithJournal(journal.NewMemory())
		if name == IdemFile {
			opt = idemretry.WithJournalDir(dir)
		}
		// The retry budget is off: the peers have none, and the retry case
		// fails every action's first attempt, which the budget would
		// (rightly) park once its tokens are spent.
		t, err := idemretry.NewTransport(base, opt, idemretry.WithBackOff(zeroBackOff),
			idemretry.WithMaxRetries(maxRetries), idemretry.WithRetryBudget(0, 0))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		c.HTTP, c.Keyed, c.close = &http.Client{Transport: t}, true, t.Close
	case RetryableHTTPKey, FailsafeKey:
		peer := map[string]string{RetryableHTTPKey: RetryableHTTP, FailsafeKey: Failsafe}[name]
		pc, err := newClient(peer, dir, base)
		if err != nil {
			return nil, err
		}
		pc.Name, pc.HandKey = name, true
		return pc, nil
	case RetryableHTTP:
		rc := &retryablehttp.Client{
			HTTPClient: &http.Client{Transport: base},
			Logger:     nil, // the default logger prints every request
			RetryMax:   maxRetries,
			CheckRetry: retryablehttp.DefaultRetryPolicy,
			Backoff:    func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 0 },
		}
		c.HTTP = &http.Client{Transport: &retryablehttp.RoundTripper{Client: rc}}
	case Failsafe, FailsafeNoClose:
		b := failsafehttp.NewRetryPolicyBuilder().WithMaxRetries(maxRetries)
		if name == Failsafe {
			// failsafehttp neither drains nor closes a response it retries
			// past, so its connection is never reused (and, with a body,
			// never freed). Every careful user adds this listener; the
			// benchmark does too, so that it measures a usable setup.
			b = b.OnRetryScheduled(func(e failsafe.ExecutionScheduledEvent[*http.Response]) {
				discard(e.LastResult())
			})
		}
		c.HTTP = &http.Client{Transport: failsafehttp.NewRoundTripper(base, b.Build())}
	default:
		return nil, fmt.Errorf("unknown client %q", name)
	}
	return c, nil
}

// Post sends one POST of payload to url and checks that the answer is 201.
// A keyed client sends it as action id; tag also names the action in
// ActionHeader, for the flaky server. Plain net/http retries a 503 by hand,
// the least any caller would do, so that it stays the baseline when the
// server fails. Post reads and closes the response, as a caller must.
func (c *Client) Post(ctx context.Context, url string, payload []byte, id string, tag bool) error {
	if c.Keyed {
		ctx = idemretry.WithAction(ctx, id)
	}
	var key string
	if c.HandKey {
		key = uuid.NewString()
	}
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if tag {
			req.Header.Set(ActionHeader, id)
		}
		resp, err := c.HTTP.Do(req)
		if err != nil {
			return err
		}
		status := resp.StatusCode
		discard(resp)
		switch {
		case status == http.StatusCreated:
			return nil
		case c.Name == NetHTTP && status == http.StatusServiceUnavailable && attempt < maxRetries:
			continue
		}
		return fmt.Errorf("%s: status %d, want 201", c.Name, status)
	}
}

// discard drains and closes a response so its connection can be reused.
func discard(resp *http.Response) {
	if resp != nil && resp.Body != nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
