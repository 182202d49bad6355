package otelidemretry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/idemretry/idemretry"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/idemretry/idemretry/otelidemretry"

// DefaultKeyHeader is the header whose key is hashed unless WithKeyHeader
// names another: idemretry's default.
//
// Deprecated: use idemretry.DefaultKeyHeader, the one definition.
const DefaultKeyHeader = idemretry.DefaultKeyHeader

// An Option configures an Instrumentation.
type Option func(*config)

type config struct {
	tp        trace.TracerProvider
	mp        metric.MeterProvider
	prop      propagation.TextMapPropagator
	keyHeader string
	secret    []byte
	noHashes  bool
	errs      []error
	secretSet bool
}

func (c *config) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%w: "+format, append([]any{idemretry.ErrInvalidOption}, args...)...))
}

// WithTracerProvider sets where spans go (default: the global
// TracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return nonNil(tp, "TracerProvider", func(c *config) { c.tp = tp })
}

// WithMeterProvider sets where metrics go (default: the global
// MeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return nonNil(mp, "MeterProvider", func(c *config) { c.mp = mp })
}

// WithPropagators sets what carries the span's context in each attempt's
// headers (default: the global TextMapPropagator).
func WithPropagators(p propagation.TextMapPropagator) Option {
	return nonNil(p, "TextMapPropagator", func(c *config) { c.prop = p })
}

// nonNil is the Option that applies set, or fails with ErrInvalidOption
// naming what when v, an interface, is nil.
func nonNil[T any](v T, what string, set func(*config)) Option {
	return func(c *config) {
		if any(v) == nil {
			c.fail("nil %s", what)
			return
		}
		set(c)
	}
}

// WithKeyHeader names the header that carries the key, as given to
// idemretry.WithKeyHeader (default idemretry.DefaultKeyHeader), so that its value
// is hashed and kept out of error messages.
func WithKeyHeader(name string) Option {
	return func(c *config) {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			c.fail("key header name %q", name)
			return
		}
		c.keyHeader = http.CanonicalHeaderKey(name)
	}
}

// WithHashSecret records the key and the action id as HMAC-SHA-256 with
// secret (first 8 bytes, in hex) instead of plain SHA-256. Use it when the
// ids are guessable (an order number, say): a plain hash of a guessable id
// can be reversed by trying them all.
func WithHashSecret(secret []byte) Option {
	return func(c *config) {
		if len(secret) == 0 {
			c.fail("empty hash secret")
			return
		}
		c.secret, c.secretSet = append([]byte(nil), secret...), true
	}
}

// WithoutHashes records neither the key's hash nor the action's.
func WithoutHashes() Option { return func(c *config) { c.noHashes = true } }

// Instrumentation holds the tracer and the metric instruments that the
// Transports it makes share. It is safe for concurrent use.
type Instrumentation struct {
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	keyHeader string
	secret    []byte
	noHashes  bool
	m         instruments
	reg       metric.Registration

	mu      sync.Mutex
	live    map[*idemretry.Transport]struct{}
	retired idemretry.Stats // of the Transports closed
	closed  bool
}

// New returns an Instrumentation, or an error wrapping
// idemretry.ErrInvalidOption for an option it cannot use, or the meter's
// error. Close it when done with it, to unregister its metric callback.
func New(opts ...Option) (*Instrumentation, error) {
	c := config{keyHeader: idemretry.DefaultKeyHeader}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.secretSet && c.noHashes {
		c.fail("both WithHashSecret and WithoutHashes")
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	in := &Instrumentation{
		tracer:    c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:      c.prop,
		keyHeader: c.keyHeader,
		secret:    c.secret,
		noHashes:  c.noHashes,
		live:      make(map[*idemretry.Transport]struct{}),
	}
	meter := c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	if err := in.m.init(meter); err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(in.observeStats, in.m.reserves, in.m.syncs)
	if err != nil {
		return nil, fmt.Errorf("otelidemretry: register the stats callback: %w", err)
	}
	in.reg = reg
	return in, nil
}

// Close unregisters the Instrumentation's metric callback: the counts of
// journal reservations and syncs stop. Its Transports go on recording everything else.
func (in *Instrumentation) Close() error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	in.mu.Unlock()
	return in.reg.Unregister()
}

// NewTransport returns idemretry.NewTransport(base, opts...) instrumented:
// its attempts go through base wrapped to record them on the span (and
// carry its context), and its events feed the metrics. A nil base is a
// clone of http.DefaultTransport, as idemretry's.
func (in *Instrumentation) NewTransport(base http.RoundTripper, opts ...idemretry.Option) (*Transport, error) {
	if base == nil {
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			base = dt.Clone()
		} else {
			base = http.DefaultTransport
		}
	}
	all := append(append([]idemretry.Option(nil), opts...), idemretry.WithObserver(in.observe))
	t, err := idemretry.NewTransport(&attemptTransport{in: in, base: base}, all...)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	in.live[t] = struct{}{}
	in.mu.Unlock()
	return &Transport{in: in, t: t}, nil
}

// NewTransport is New() with the global providers, then its NewTransport;
// the returned Transport's Close closes that Instrumentation too.
func NewTransport(base http.RoundTripper, opts ...idemretry.Option) (*Transport, error) {
	in, err := New()
	if err != nil {
		return nil, err
	}
	t, err := in.NewTransport(base, opts...)
	if err != nil {
		return nil, errors.Join(err, in.Close())
	}
	t.owned = true
	return t, nil
}

// retire moves a closed Transport's counters to the retired totals, so
// that the sums the callback reports never go down.
func (in *Instrumentation) retire(t *idemretry.Transport) {
	s := t.Stats()
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ok := in.live[t]; !ok {
		return
	}
	delete(in.live, t)
	in.retired.Reserves += s.Reserves
	in.retired.Syncs += s.Syncs
}

// hash returns the first 8 bytes of id's SHA-256 (or HMAC-SHA-256), in hex.
func (in *Instrumentation) hash(id string) string {
	var sum []byte
	if in.secret != nil {
		h := hmac.New(sha256.New, in.secret)
		h.Write([]byte(id))
		sum = h.Sum(nil)
	} else {
		s := sha256.Sum256([]byte(id))
		sum = s[:]
	}
	return hex.EncodeToString(sum[:8])
}
