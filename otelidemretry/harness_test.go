package otelidemretry_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/otelidemretry"
	"go.uber.org/goleak"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness is an instrumented Transport whose spans and metrics stay in
// memory: the SDK's span recorder and manual metric reader.
type harness struct {
	t      *testing.T
	sr     *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	in     *otelidemretry.Instrumentation
	tr     *otelidemretry.Transport
	client *http.Client
	dir    string
}

// fastBackOff keeps the retries' waits in milliseconds.
func fastBackOff() idemretry.Option {
	return idemretry.WithBackOff(func() backoff.BackOff {
		return idemretry.NewFullJitter(time.Millisecond, 5*time.Millisecond, nil)
	})
}

func newHarness(t *testing.T, oopts []otelidemretry.Option, opts ...idemretry.Option) *harness {
	t.Helper()
	h := &harness{t: t, sr: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader(), dir: t.TempDir()}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.sr))
	h.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	t.Cleanup(func() {
		_ = h.tp.Shutdown(context.Background())
		_ = h.mp.Shutdown(context.Background())
	})
	all := append([]otelidemretry.Option{otelidemretry.WithTracerProvider(h.tp), otelidemretry.WithMeterProvider(h.mp),
		otelidemretry.WithPropagators(propagation.TraceContext{})}, oopts...)
	in, err := otelidemretry.New(all...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.in = in
	t.Cleanup(func() { _ = in.Close() })
	h.tr = h.transport(opts...)
	h.client = &http.Client{Transport: h.tr}
	return h
}

// transport makes another Transport of the harness's Instrumentation, on
// its journal directory.
func (h *harness) transport(opts ...idemretry.Option) *otelidemretry.Transport {
	h.t.Helper()
	all := append([]idemretry.Option{idemretry.WithJournalDir(h.dir), fastBackOff()}, opts...)
	tr, err := h.in.NewTransport(nil, all...)
	if err != nil {
		h.t.Fatalf("NewTransport: %v", err)
	}
	h.t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// post sends a POST of body to url as the action id (none if ""), and
// returns the response with its body read, or the error.
func (h *harness) post(ctx context.Context, url, action, body string) (*http.Response, string, error) {
	h.t.Helper()
	if action != "" {
		ctx = idemretry.WithAction(ctx, action)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := h.tr.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr != nil {
		h.t.Fatalf("read body: %v", rerr)
	}
	return resp, string(b), nil
}

// span returns the only span ended.
func (h *harness) span() sdktrace.ReadOnlySpan {
	h.t.Helper()
	ended := h.sr.Ended()
	if len(ended) != 1 {
		h.t.Fatalf("%d spans ended, want 1", len(ended))
	}
	return ended[0]
}

func attrMap(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// wantAttrs checks that kvs holds every attribute of want, with its type
// and value.
func wantAttrs(t *testing.T, what string, kvs []attribute.KeyValue, want ...attribute.KeyValue) {
	t.Helper()
	got := attrMap(kvs)
	for _, w := range want {
		switch v, ok := got[w.Key]; {
		case !ok:
			t.Errorf("%s: no %s, want %s", what, w.Key, w.Value.Emit())
		case v != w.Value:
			t.Errorf("%s: %s = %s (%s), want %s (%s)", what, w.Key, v.Emit(), v.Type(), w.Value.Emit(), w.Value.Type())
		}
	}
}

func noAttr(t *testing.T, what string, kvs []attribute.KeyValue, key attribute.Key) {
	t.Helper()
	if v, ok := attrMap(kvs)[key]; ok {
		t.Errorf("%s: %s = %v, want none", what, key, v.Emit())
	}
}

// collect reads the metrics.
func (h *harness) collect() metricdata.ResourceMetrics {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatalf("collect: %v", err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// dataOf returns the data of metric name, which must be a D (described by
// want), and whether rm has the metric.
func dataOf[D any](t *testing.T, rm metricdata.ResourceMetrics, name, want string) (D, bool) {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		var none D
		return none, false
	}
	d, ok := m.Data.(D)
	if !ok {
		t.Fatalf("%s is %T, want %s", name, m.Data, want)
	}
	return d, true
}

// sum adds up an int64 counter's points whose attributes include match
// (all of them for none).
func sum(t *testing.T, rm metricdata.ResourceMetrics, name string, match ...attribute.KeyValue) int64 {
	t.Helper()
	s, ok := dataOf[metricdata.Sum[int64]](t, rm, name, "an int64 sum")
	if !ok {
		return 0
	}
	if !s.IsMonotonic {
		t.Errorf("%s is not monotonic", name)
	}
	var n int64
	for _, dp := range s.DataPoints {
		if has(dp.Attributes, match) {
			n += dp.Value
		}
	}
	return n
}

func has(set attribute.Set, match []attribute.KeyValue) bool {
	for _, kv := range match {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// histCount is how many values a float64 histogram holds (whose
// attributes include match).
func histCount(t *testing.T, rm metricdata.ResourceMetrics, name string, match ...attribute.KeyValue) uint64 {
	t.Helper()
	hd, ok := dataOf[metricdata.Histogram[float64]](t, rm, name, "a float64 histogram")
	if !ok {
		return 0
	}
	var n uint64
	for _, dp := range hd.DataPoints {
		if has(dp.Attributes, match) {
			n += dp.Count
		}
	}
	return n
}

// histSum is the sum of the values a float64 histogram holds.
func histSum(t *testing.T, rm metricdata.ResourceMetrics, name string) float64 {
	t.Helper()
	hd, ok := dataOf[metricdata.Histogram[float64]](t, rm, name, "a float64 histogram")
	if !ok {
		return 0
	}
	var f float64
	for _, dp := range hd.DataPoints {
		f += dp.Sum
	}
	return f
}

// near reports whether two sums of seconds are equal but for float
// rounding.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// sumStats adds up every counter of sts, field by field.
func sumStats(sts ...idemretry.Stats) idemretry.Stats {
	var total idemretry.Stats
	sum := reflect.ValueOf(&total).Elem()
	for _, st := range sts {
		v := reflect.ValueOf(st)
		for i := range v.NumField() {
			sum.Field(i).SetInt(sum.Field(i).Int() + v.Field(i).Int())
		}
	}
	return total
}

// checkStats checks that every counter metric totals its Stats field.
func checkStats(t *testing.T, rm metricdata.ResourceMetrics, s idemretry.Stats) {
	t.Helper()
	for _, c := range []struct {
		name  string
		match []attribute.KeyValue
		want  int64
	}{
		{"idemretry.attempts", nil, s.Attempts},
		{"idemretry.retries", nil, s.Retries},
		{"idemretry.done", nil, s.Done},
		{"idemretry.done", []attribute.KeyValue{otelidemretry.ReplayedKey.Bool(true)}, s.Replays},
		{"idemretry.give_ups", []attribute.KeyValue{otelidemretry.ReasonKey.String("attempts_exhausted")}, s.GiveUpsExhausted},
		{"idemretry.give_ups", []attribute.KeyValue{otelidemretry.ReasonKey.String("retry_after_too_long")}, s.GiveUpsRetryAfter},
		{"idemretry.give_ups", []attribute.KeyValue{otelidemretry.ReasonKey.String("wait_exceeds_deadline")}, s.GiveUpsDeadline},
		{"idemretry.give_ups", []attribute.KeyValue{otelidemretry.ReasonKey.String("other")}, s.GiveUpsOther},
		{"idemretry.parked", nil, s.Parked},
		{"idemretry.unknown", nil, s.Unknown},
		{"idemretry.resumed", nil, s.Resumed},
		{"idemretry.journal.reserves", nil, s.Reserves},
		{"idemretry.journal.syncs", nil, s.Syncs},
	} {
		if got := sum(t, rm, c.name, c.match...); got != c.want {
			t.Errorf("%s %v = %d, Stats say %d", c.name, c.match, got, c.want)
		}
	}
	for _, h := range []struct {
		name  string
		count int64
		time  time.Duration // 0: not checked
	}{
		{"idemretry.attempt.duration", s.Attempts, 0},
		{"idemretry.journal.reserve.duration", s.Reserves, s.ReserveTime},
		{"idemretry.journal.sync.duration", s.Syncs, s.SyncTime},
	} {
		if got := histCount(t, rm, h.name); int64(got) != h.count {
			t.Errorf("%s holds %d values, Stats say %d", h.name, got, h.count)
		}
		if got := histSum(t, rm, h.name); h.time != 0 && !near(got, h.time.Seconds()) {
			t.Errorf("%s sums to %v s, Stats say %v", h.name, got, h.time.Seconds())
		}
	}
}

// checkNoSecrets fails if any span (name, attribute, event, status) or
// metric attribute holds one of secrets.
func (h *harness) checkNoSecrets(secrets ...string) {
	h.t.Helper()
	var texts []string
	for _, s := range h.sr.Ended() {
		texts = append(texts, s.Name(), s.Status().Description)
		for _, kv := range s.Attributes() {
			texts = append(texts, string(kv.Key)+"="+kv.Value.Emit())
		}
		for _, ev := range s.Events() {
			texts = append(texts, ev.Name)
			for _, kv := range ev.Attributes {
				texts = append(texts, string(kv.Key)+"="+kv.Value.Emit())
			}
		}
	}
	rm := h.collect()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Sum[float64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			}
			for _, set := range sets {
				for _, kv := range set.ToSlice() {
					texts = append(texts, m.Name+" "+string(kv.Key)+"="+kv.Value.Emit())
				}
			}
		}
	}
	if len(texts) == 0 {
		h.t.Fatal("nothing recorded to check")
	}
	for _, secret := range secrets {
		if secret == "" {
			h.t.Fatal("checkNoSecrets: empty secret")
		}
		for _, text := range texts {
			if strings.Contains(text, secret) {
				h.t.Errorf("recorded %q, which holds the secret %q", text, secret)
			}
		}
	}
}

// hash8 is the first 8 bytes of s's SHA-256, in hex.
func hash8(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// server is a loopback payment server whose answers a test scripts: for
// the n-th request (from 1) of a key, answer(n) writes the response. It
// records each request's key and traceparent header.
type server struct {
	*httptest.Server
	mu          sync.Mutex
	seen        map[string]int
	keys        []string
	traceparent []string
}

// failOnce answers a key's first request with code, and every later one 201
// with body.
func failOnce(code int, body string) func(w http.ResponseWriter, n int) {
	return func(w http.ResponseWriter, n int) {
		if n == 1 {
			w.WriteHeader(code)
			return
		}
		w.WriteHeader(http.StatusCreated)
		if body != "" {
			_, _ = w.Write([]byte(body))
		}
	}
}

func newServer(t *testing.T, answer func(w http.ResponseWriter, n int)) *server {
	t.Helper()
	s := &server{seen: make(map[string]int)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			key = r.Header.Get("X-Pay-Key")
		}
		s.mu.Lock()
		s.seen[key]++
		n := s.seen[key]
		s.keys = append(s.keys, key)
		s.traceparent = append(s.traceparent, r.Header.Get("Traceparent"))
		s.mu.Unlock()
		answer(w, n)
	}))
	t.Cleanup(s.Close)
	return s
}

// onlyKey returns the one key the server saw.
func (s *server) onlyKey(t *testing.T) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) != 1 {
		t.Fatalf("server saw %d keys (%v), want 1", len(s.seen), s.keys)
	}
	for k := range s.seen {
		if k == "" {
			t.Fatal("server saw no key")
		}
		return k
	}
	return ""
}

// hijackAndClose drops the connection of the request w answers, with no
// response: a real transport error (io.EOF) for the attempt that sent it.
func hijackAndClose(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}
