package idemretry

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// A RequestOption overrides one of the Transport's settings for the
// requests sent with a context (WithRequestOptions): for that request only,
// whatever the Transport's options say. They compose with WithAction.
type RequestOption func(*settings)

// settings are what one RoundTrip runs with: the Transport's options, with
// the request's overrides applied.
type settings struct {
	maxRetries int
	keyWindow  time.Duration
	policy     RetryPolicy
	newBackOff func() backoff.BackOff // nil: the default (defaultBackOff)
	// bo is the caller's BackOff for this RoundTrip, made and started
	// with it (startBackOff), or nil for the default's.
	bo backoff.BackOff
}

type requestOptionsKey struct{}

// WithRequestOptions returns a copy of ctx whose requests run with opts
// applied over the Transport's settings, in order, after those of any
// enclosing WithRequestOptions. A value the Transport cannot use makes
// RoundTrip fail with ErrInvalidOption before anything is sent.
func WithRequestOptions(ctx context.Context, opts ...RequestOption) context.Context {
	prev, _ := ctx.Value(requestOptionsKey{}).([]RequestOption)
	all := append(append([]RequestOption(nil), prev...), opts...)
	return context.WithValue(ctx, requestOptionsKey{}, all)
}

// RequestMaxRetries sets how many retries may follow the first attempt
// (see WithMaxRetries); 0 sends the request once (with its key, journaled
// as usual).
func RequestMaxRetries(n int) RequestOption { return func(s *settings) { s.maxRetries = n } }

// RequestRetries is RequestMaxRetries.
//
// Deprecated: use RequestMaxRetries, the twin of WithMaxRetries.
func RequestRetries(n int) RequestOption { return RequestMaxRetries(n) }

// RequestKeyWindow shortens the key window (see WithKeyWindow) for the
// request's action: a key
// older than d is not sent (ErrKeyWindowExpired). It cannot lengthen the
// Transport's window, which its journal keeps records for.
func RequestKeyWindow(d time.Duration) RequestOption { return func(s *settings) { s.keyWindow = d } }

// RequestRetryPolicy replaces the RetryPolicy (see WithRetryPolicy); nil
// keeps the Transport's.
func RequestRetryPolicy(p RetryPolicy) RequestOption {
	return func(s *settings) {
		if p != nil {
			s.policy = p
		}
	}
}

// RequestPolicy is RequestRetryPolicy.
//
// Deprecated: use RequestRetryPolicy, the twin of WithRetryPolicy.
func RequestPolicy(p RetryPolicy) RequestOption { return RequestRetryPolicy(p) }

// RequestBackOff replaces the backoff (see WithBackOff); nil keeps the
// Transport's.
func RequestBackOff(newBackOff func() backoff.BackOff) RequestOption {
	return func(s *settings) {
		if newBackOff != nil {
			s.newBackOff = newBackOff
		}
	}
}

// settingsFor returns the settings req runs with.
func (t *Transport) settingsFor(ctx context.Context) (settings, error) {
	s := settings{maxRetries: t.cfg.maxRetries, keyWindow: t.cfg.keyWindow, policy: t.cfg.policy, newBackOff: t.cfg.newBackOff}
	if opts, _ := ctx.Value(requestOptionsKey{}).([]RequestOption); len(opts) > 0 {
		s = applyRequestOptions(s, opts)
	}
	switch {
	case s.maxRetries < 0:
		return s, fmt.Errorf("%w: request max retries %d, want >= 0", ErrInvalidOption, s.maxRetries)
	case s.keyWindow <= 0 || s.keyWindow > t.cfg.keyWindow:
		return s, fmt.Errorf("%w: request key window %v, want > 0 and at most the Transport's %v", ErrInvalidOption, s.keyWindow, t.cfg.keyWindow)
	}
	return s, nil
}

// applyRequestOptions returns s with opts applied. It is apart from
// settingsFor so that s is moved to the heap (the options take its address)
// only for the requests that have options.
func applyRequestOptions(s settings, opts []RequestOption) settings {
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	return s
}
