package payments

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemretry/idemretry"
)

// loopPayer is flavours 1 and 2: a plain retry loop, as fair as possible
// (the library's retry policy, attempt count, backoff type and Retry-After
// cap) but with the key mistakes: no key, or a new key on every attempt.
type loopPayer struct {
	flavour  Flavour
	base     *http.Transport
	client   *http.Client
	url      string
	name     string // client name for the server's log
	strategy Strategy
	rand     idemretry.Random
	clock    *Clock
	life     int // incarnation, so that keys stay unique across restarts
	attempts int
}

func newLoopPayer(f Flavour, url, name string, life int, s Strategy, r idemretry.Random, clk *Clock, attemptTimeout time.Duration) *loopPayer {
	base := newBase(clk, attemptTimeout)
	path := ChargesPath
	if f == Naive {
		path = LegacyChargesPath
	}
	return &loopPayer{flavour: f, base: base, client: &http.Client{Transport: base}, url: url + path,
		name: name, strategy: s, rand: r, clock: clk, life: life}
}

func (p *loopPayer) pay(ctx context.Context, in *Intent) bool {
	bo := p.strategy.New(p.rand)
	bo.Reset()
	for retry := 0; ; retry++ {
		// The body has no GetBody on purpose: net/http resends a request that
		// carries an Idempotency-Key by itself when a reused connection
		// fails, with the same key, which would quietly fix flavour 2's
		// mistake on some drops and not others.
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, io.NopCloser(bytes.NewReader(in.body)))
		if err != nil {
			return false
		}
		req.ContentLength = int64(len(in.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(ClientHeader, p.name)
		if p.flavour == KeyPerAttempt {
			p.attempts++
			req.Header.Set(KeyHeader, fmt.Sprintf("%s-%s-%d-%d", p.name, in.ID, p.life, p.attempts))
		}
		resp, err := p.client.Do(req)
		if !idemretry.DefaultRetryPolicy(ctx, resp, err) {
			ok := success(resp, err)
			drain(resp)
			return ok
		}
		if retry >= idemretry.DefaultMaxRetries {
			drain(resp)
			return false
		}
		wait := bo.NextBackOff()
		if ra, ok := retryAfter(resp); ok {
			if ra > idemretry.DefaultMaxRetryAfter {
				drain(resp)
				return false
			}
			wait = max(wait, ra)
		}
		drain(resp)
		if !sleepCtx(ctx, p.clock, wait) {
			return false
		}
	}
}

func (p *loopPayer) crash() { p.base.CloseIdleConnections() }

func (p *loopPayer) close() error {
	p.base.CloseIdleConnections()
	return nil
}

// retryAfter reads a delta-seconds Retry-After of a 429 or 503, the form
// this server sends. (The library's parser is unexported.)
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
		return 0, false
	}
	secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After")))
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(secs) * time.Second, true
}

// sleepCtx waits d of virtual time on clk; false if ctx ended first.
func sleepCtx(ctx context.Context, clk *Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := clk.NewTimer()
	t.Start(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}
