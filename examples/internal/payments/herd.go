package payments

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// RetryAfterRule is how a client combines the server's Retry-After with its
// own drawn backoff wait.
type RetryAfterRule int

const (
	// FloorRule is the library's rule: Retry-After is a floor and the drawn
	// full-jitter wait is added on top of it.
	FloorRule RetryAfterRule = iota + 1
	// MaxRule is the library's rule before the retry budget came:
	// max(drawn wait, Retry-After). The library no longer has it; the herd
	// reproduces it with a BackOff that returns max(j, RA) - RA, to which the
	// Transport adds RA back (see maxRuleBackOff).
	MaxRule
)

func (r RetryAfterRule) String() string {
	switch r {
	case FloorRule:
		return "new: Retry-After + drawn wait (the library's default)"
	case MaxRule:
		return "old: max(drawn wait, Retry-After) (reproduced)"
	}
	return fmt.Sprintf("RetryAfterRule(%d)", int(r))
}

// HerdConfig is the Retry-After herd: Clients clients, each with its own
// Transport, send a payment at the same moment; the server holds every one
// until all have arrived and answers them all at once with 429 and
// "Retry-After: RetryAfter", then answers each retry 200 and notes when it
// arrived. Durations are virtual time.
type HerdConfig struct {
	Scale      float64
	Clients    int
	Rounds     int // herds per rule, one after another
	RetryAfter int // seconds
	Rule       RetryAfterRule
}

// DefaultHerd is twenty clients told "Retry-After: 1", five rounds, at the
// payments scenario's scale.
func DefaultHerd(rule RetryAfterRule) HerdConfig {
	return HerdConfig{Scale: 10, Clients: 20, Rounds: 5, RetryAfter: 1, Rule: rule}
}

// HerdResult is what the rounds of one rule measured.
type HerdResult struct {
	Rule    RetryAfterRule
	Clients int
	// Per round: the width of the window in which the clients' retries
	// reached the server (last minus first), and the first and last retry's
	// arrival after the server sent the 429s.
	Widths, Earliest, Latest []time.Duration
	RetryAfter               time.Duration
}

// MedianWidth is the median of the rounds' widths.
func (r *HerdResult) MedianWidth() time.Duration { return median(r.Widths) }

func median(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// RunHerd plays cfg.Rounds herds under cfg.Rule.
func RunHerd(ctx context.Context, cfg HerdConfig) (*HerdResult, error) {
	if cfg.Clients < 2 || cfg.Rounds < 1 || cfg.RetryAfter < 1 {
		return nil, fmt.Errorf("payments: a herd needs 2+ clients, 1+ rounds and a Retry-After of 1 s or more (got %d, %d, %d)", cfg.Clients, cfg.Rounds, cfg.RetryAfter)
	}
	res := &HerdResult{Rule: cfg.Rule, Clients: cfg.Clients, RetryAfter: time.Duration(cfg.RetryAfter) * time.Second}
	for round := range cfg.Rounds {
		answered, retries, err := herdRound(ctx, cfg, round)
		if err != nil {
			return nil, err
		}
		var after []time.Duration // each retry's arrival after the 429s
		for _, t := range retries {
			after = append(after, t.Sub(answered))
		}
		first, last := slices.Min(after), slices.Max(after)
		res.Widths = append(res.Widths, last-first)
		res.Earliest = append(res.Earliest, first)
		res.Latest = append(res.Latest, last)
	}
	return res, nil
}

// herdServer answers each key's first request with 429 once every client's
// has arrived, and notes when each retry arrives.
type herdServer struct {
	clock      *Clock
	clients    int
	retryAfter string

	mu       sync.Mutex
	seen     map[string]bool
	release  chan struct{}
	answered time.Time
	retries  []time.Time
}

func (s *herdServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(KeyHeader)
	s.mu.Lock()
	if s.seen[key] {
		s.retries = append(s.retries, s.clock.Now())
		s.mu.Unlock()
		reply(w, http.StatusOK, []byte(`{"status":"succeeded"}`))
		return
	}
	s.seen[key] = true
	if len(s.seen) == s.clients {
		s.answered = s.clock.Now()
		close(s.release)
	}
	s.mu.Unlock()
	select {
	case <-s.release:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Retry-After", s.retryAfter)
	reply(w, http.StatusTooManyRequests, errorBody("rate limited"))
}

func herdRound(ctx context.Context, cfg HerdConfig, round int) (time.Time, []time.Time, error) {
	clk := NewClock(cfg.Scale)
	hs := &herdServer{clock: clk, clients: cfg.Clients, retryAfter: fmt.Sprint(cfg.RetryAfter),
		seen: map[string]bool{}, release: make(chan struct{})}
	srv := httptest.NewServer(hs)
	defer srv.Close()

	var wg sync.WaitGroup
	errs := make([]error, cfg.Clients)
	for c := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[c] = herdClient(ctx, cfg.Rule, clk, srv.URL+ChargesPath, fmt.Sprintf("pay:herd-%d-%d", round, c))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return time.Time{}, nil, err
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if len(hs.retries) != cfg.Clients {
		return time.Time{}, nil, fmt.Errorf("payments: herd round %d: %d retries for %d clients", round, len(hs.retries), cfg.Clients)
	}
	return hs.answered, slices.Clone(hs.retries), nil
}

// herdClient is one client of a herd: its own Transport, one payment.
func herdClient(ctx context.Context, rule RetryAfterRule, clk *Clock, url, action string) error {
	base := &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}
	defer base.CloseIdleConnections()
	mem := journal.NewMemory()
	defer mem.Close()
	opts := []idemretry.Option{idemretry.WithClock(clk), idemretry.WithJournal(mem)}
	if rule == MaxRule {
		m := &maxRuleBackOff{clock: clk, jitter: idemretry.NewFullJitter(idemretry.DefaultBaseDelay, idemretry.DefaultMaxDelay, nil)}
		opts = append(opts, idemretry.WithRetryPolicy(m.policy), idemretry.WithBackOff(func() backoff.BackOff { return m }))
	}
	t, err := idemretry.NewTransport(base, opts...)
	if err != nil {
		return err
	}
	defer t.Close()
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, action), http.MethodPost, url,
		bytes.NewReader([]byte(`{"intent":"herd","amount":1000}`)))
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		return err
	}
	drain(resp)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("payments: herd client %s: status %d", action, resp.StatusCode)
	}
	return nil
}

// maxRuleBackOff brings back the old rule, wait = max(j, RA), on a
// Transport whose rule is wait = b + RA: its retry policy (the default one)
// notes the Retry-After of the answer it judges, and the backoff it feeds
// returns b = max(j, RA) - RA for the full-jitter draw j. One per Transport
// with one action at a time: the policy and the backoff run in turn.
type maxRuleBackOff struct {
	clock  *Clock
	jitter backoff.BackOff
	ra     time.Duration // of the answer last judged
}

func (m *maxRuleBackOff) policy(ctx context.Context, resp *http.Response, err error) bool {
	m.ra, _ = idemretry.RetryAfter(resp, m.clock.Now())
	return idemretry.DefaultRetryPolicy(ctx, resp, err)
}

func (m *maxRuleBackOff) NextBackOff() time.Duration {
	j := m.jitter.NextBackOff()
	if j == backoff.Stop {
		return j
	}
	return max(j, m.ra) - m.ra
}

func (m *maxRuleBackOff) Reset() { m.jitter.Reset() }
