package otelidemretry_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
	"github.com/idemretry/idemretry/otelidemretry"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
)

const (
	action      = "pay:order-7731-alice"
	querySecret = "tok-s3cret-9f2"
)

// A payment answered 503 then 201: one client span, two attempt events,
// the final status, the hashes and never the key or the action id; the
// metrics equal the Transport's Stats; the attempts carried the span's
// context.
func TestRetriedPaymentSpan(t *testing.T) {
	srv := newServer(t, failOnce(http.StatusServiceUnavailable, `{"charged":true}`))
	h := newHarness(t, nil)
	resp, body, err := h.post(context.Background(), srv.URL+"/payments?token="+querySecret, action, `{"amount":100}`)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	if resp.StatusCode != http.StatusCreated || body != `{"charged":true}` {
		t.Fatalf("got %d %q, want 201 and the body", resp.StatusCode, body)
	}
	key := srv.onlyKey(t)

	s := h.span()
	if s.Name() != "idemretry POST" || s.SpanKind() != trace.SpanKindClient {
		t.Errorf("span %q of kind %v, want \"idemretry POST\" of kind client", s.Name(), s.SpanKind())
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("span status %v, want unset", s.Status())
	}
	attrs := s.Attributes()
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	wantAttrs(t, "span", attrs,
		semconv.HTTPRequestMethodKey.String("POST"),
		semconv.URLFullKey.String(srv.URL+"/payments?token=REDACTED"),
		semconv.ServerAddressKey.String("127.0.0.1"), semconv.ServerPortKey.Int(port),
		semconv.HTTPResponseStatusCodeKey.Int(201), otelidemretry.AttemptsKey.Int(2), otelidemretry.ReplayedKey.Bool(false),
		otelidemretry.KeyHashKey.String(hash8(key)), otelidemretry.ActionHashKey.String(hash8(action)))
	noAttr(t, "span", attrs, otelidemretry.ReasonKey)
	noAttr(t, "span", attrs, semconv.ErrorTypeKey)

	evs := s.Events()
	if len(evs) != 2 {
		t.Fatalf("%d span events, want 2: %v", len(evs), evs)
	}
	for i, want := range []int{503, 201} {
		ev := evs[i]
		what := "event " + strconv.Itoa(i+1)
		if ev.Name != otelidemretry.AttemptEvent {
			t.Errorf("%s named %q, want %q", what, ev.Name, otelidemretry.AttemptEvent)
		}
		wantAttrs(t, what, ev.Attributes,
			otelidemretry.AttemptKey.Int(i+1), semconv.HTTPResponseStatusCodeKey.Int(want))
		if d := attrMap(ev.Attributes)[otelidemretry.AttemptDuration].AsFloat64(); d <= 0 {
			t.Errorf("%s: duration %v s, want > 0", what, d)
		}
		if ev.Time.Before(s.StartTime()) || ev.Time.After(s.EndTime()) {
			t.Errorf("%s at %v, outside the span (%v to %v)", what, ev.Time, s.StartTime(), s.EndTime())
		}
	}

	// Each attempt carried the span's context (W3C traceparent).
	srv.mu.Lock()
	tps := append([]string(nil), srv.traceparent...)
	srv.mu.Unlock()
	for _, tp := range tps {
		if !strings.Contains(tp, s.SpanContext().TraceID().String()) || !strings.Contains(tp, s.SpanContext().SpanID().String()) {
			t.Errorf("attempt's traceparent %q does not name the span %v", tp, s.SpanContext())
		}
	}

	rm := h.collect()
	st := h.tr.Unwrap().Stats()
	if st.Attempts != 2 || st.Retries != 1 || st.Done != 1 {
		t.Fatalf("Stats %+v, want 2 attempts, 1 retry, 1 done", st)
	}
	checkStats(t, rm, st)
	if n := sum(t, rm, "idemretry.attempts", semconv.HTTPResponseStatusCode(503)); n != 1 {
		t.Errorf("attempts answered 503: %d, want 1", n)
	}
	if n := sum(t, rm, "idemretry.retries", semconv.HTTPResponseStatusCode(503)); n != 1 {
		t.Errorf("retries after a 503: %d, want 1", n)
	}
	if n := histCount(t, rm, "idemretry.attempt.duration", semconv.HTTPResponseStatusCode(201)); n != 1 {
		t.Errorf("attempt durations of a 201: %d, want 1", n)
	}
	h.checkNoSecrets(key, action, querySecret)

	// A payment named by its fingerprint syncs its done record: the sync
	// metrics follow Stats.
	if _, _, err := h.post(context.Background(), srv.URL+"/payments", "", `{"amount":7}`); err != nil {
		t.Fatalf("post: %v", err)
	}
	st = h.tr.Unwrap().Stats()
	if st.Syncs == 0 {
		t.Error("Stats count no journal sync for a fingerprint-named payment")
	}
	checkStats(t, h.collect(), st)

	// Closed, the Transport's syncs stay in the totals.
	if err := h.tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkStats(t, h.collect(), h.tr.Unwrap().Stats())
}

// Retries that stop on a status give the last response back: the span
// says why (attempts_exhausted, retry_after_too_long) and is an error;
// give_ups counts them by reason.
func TestGiveUpReason(t *testing.T) {
	for _, c := range []struct {
		name       string
		retryAfter string
		opts       []idemretry.Option
		reason     error
		attempts   int
	}{
		{"attempts_exhausted", "", []idemretry.Option{idemretry.WithMaxRetries(2)}, idemretry.ErrAttemptsExhausted, 3},
		{"retry_after_too_long", "120", []idemretry.Option{idemretry.WithMaxRetries(2), idemretry.WithMaxRetryAfter(time.Second)}, idemretry.ErrRetryAfterTooLong, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, n int) {
				if c.retryAfter != "" {
					w.Header().Set("Retry-After", c.retryAfter)
				}
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			h := newHarness(t, nil, c.opts...)
			id := "pay:give-up-" + c.name + "-order-55"
			resp, _, err := h.post(context.Background(), srv.URL+"/payments", id, `{"amount":1}`)
			if err != nil {
				t.Fatalf("post: %v", err)
			}
			if got := idemretry.GiveUpReason(resp); !errors.Is(got, c.reason) {
				t.Fatalf("GiveUpReason %v, want %v", got, c.reason)
			}
			s := h.span()
			wantAttrs(t, "span", s.Attributes(),
				otelidemretry.ReasonKey.String(c.name), semconv.HTTPResponseStatusCodeKey.Int(503),
				semconv.ErrorTypeKey.String("503"), otelidemretry.AttemptsKey.Int(c.attempts))
			noAttr(t, "span", s.Attributes(), otelidemretry.ReplayedKey)
			if s.Status().Code != codes.Error || s.Status().Description != c.reason.Error() {
				t.Errorf("span status %v, want Error %q", s.Status(), c.reason.Error())
			}
			st := h.tr.Unwrap().Stats()
			if len(s.Events()) != c.attempts || st.Attempts != int64(c.attempts) {
				t.Errorf("%d attempt events, Stats %d attempts; want %d", len(s.Events()), st.Attempts, c.attempts)
			}
			rm := h.collect()
			checkStats(t, rm, st)
			if n := sum(t, rm, "idemretry.give_ups", otelidemretry.ReasonKey.String(c.name)); n != 1 {
				t.Errorf("give_ups{%s} = %d, want 1", c.name, n)
			}
			h.checkNoSecrets(srv.onlyKey(t), id)
		})
	}
}

// A replayed answer: idemretry.replayed on the span, done{replayed=true}
// equal to Stats.Replays.
func TestReplayFlag(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
	})
	h := newHarness(t, nil)
	resp, _, err := h.post(context.Background(), srv.URL+"/payments", action, `{"amount":100}`)
	if err != nil || !idemretry.IsReplay(resp) {
		t.Fatalf("post: %v, %v; want a replay", resp, err)
	}
	s := h.span()
	wantAttrs(t, "span", s.Attributes(),
		otelidemretry.ReplayedKey.Bool(true), otelidemretry.AttemptsKey.Int(1))
	st := h.tr.Unwrap().Stats()
	if st.Replays != 1 {
		t.Fatalf("Stats.Replays %d, want 1", st.Replays)
	}
	rm := h.collect()
	checkStats(t, rm, st)
	if n := sum(t, rm, "idemretry.done", otelidemretry.ReplayedKey.Bool(true)); n != 1 {
		t.Errorf("done{replayed=true} = %d, want 1", n)
	}
	h.checkNoSecrets(srv.onlyKey(t), action)
}

// An outage with a retry budget of one token parks the action: the span
// says parked, maybe processed, the last status; the error message on it
// names neither the action nor its key.
func TestParkedAction(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusServiceUnavailable) })
	h := newHarness(t, nil, idemretry.WithRetryBudget(1, 0), idemretry.WithMaxRetries(5))
	_, _, err := h.post(context.Background(), srv.URL+"/payments", action, `{"amount":100}`)
	var ae *idemretry.ActionError
	if !errors.As(err, &ae) || !errors.Is(err, idemretry.ErrParked) {
		t.Fatalf("post: %v, want an ActionError with ErrParked", err)
	}
	key := srv.onlyKey(t)
	if !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), action) {
		t.Fatalf("the error %q names neither the key nor the action: the test would prove nothing", err)
	}
	s := h.span()
	attrs := s.Attributes()
	wantAttrs(t, "span", attrs,
		otelidemretry.ReasonKey.String("parked"), otelidemretry.MaybeProcessedKey.Bool(true),
		semconv.HTTPResponseStatusCodeKey.Int(503), otelidemretry.AttemptsKey.Int(2),
		semconv.ErrorTypeKey.String("github.com/idemretry/idemretry.ActionError"),
		otelidemretry.KeyHashKey.String(hash8(key)))
	if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "parked by the retry budget") {
		t.Errorf("span status %v, want Error saying parked", s.Status())
	}
	st := h.tr.Unwrap().Stats()
	if st.Parked != 1 {
		t.Fatalf("Stats.Parked %d, want 1", st.Parked)
	}
	checkStats(t, h.collect(), st)
	h.checkNoSecrets(key, action)
}

// A server that is down: each attempt's event has error.type and a
// message; the span has the ActionError's reason and says the server
// cannot have performed the action.
func TestTransportErrors(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) {})
	down := srv.URL
	srv.Close() // a real stopped server: connections are refused
	h := newHarness(t, nil, idemretry.WithMaxRetries(2))
	_, _, err := h.post(context.Background(), down+"/payments?token="+querySecret, action, `{"amount":100}`)
	var ae *idemretry.ActionError
	if !errors.As(err, &ae) || !errors.Is(err, idemretry.ErrAttemptsExhausted) {
		t.Fatalf("post: %v, want an ActionError with ErrAttemptsExhausted", err)
	}
	s := h.span()
	attrs := s.Attributes()
	wantAttrs(t, "span", attrs,
		otelidemretry.ReasonKey.String("attempts_exhausted"), otelidemretry.MaybeProcessedKey.Bool(false),
		otelidemretry.AttemptsKey.Int(3), otelidemretry.KeyHashKey.String(hash8(ae.Key)),
		otelidemretry.ActionHashKey.String(hash8(action)))
	noAttr(t, "span", attrs, semconv.HTTPResponseStatusCodeKey)
	if len(s.Events()) != 3 {
		t.Fatalf("%d events, want 3", len(s.Events()))
	}
	for _, ev := range s.Events() {
		m := attrMap(ev.Attributes)
		if m[semconv.ErrorTypeKey].AsString() == "" || !strings.Contains(m[semconv.ErrorMessageKey].AsString(), "refused") {
			t.Errorf("attempt event %v: want error.type and a message saying refused", ev.Attributes)
		}
	}
	if !strings.Contains(s.Status().Description, "attempts exhausted") {
		t.Errorf("span status %v, want it to say attempts exhausted", s.Status())
	}
	rm := h.collect()
	st := h.tr.Unwrap().Stats()
	checkStats(t, rm, st)
	if n := sum(t, rm, "idemretry.attempts"); n != 3 {
		t.Errorf("attempts = %d, want 3", n)
	}
	h.checkNoSecrets(ae.Key, action, querySecret)
}

// A Retry-After past the action's key window makes its outcome unknown:
// reason key_window_expired on the span and on idemretry.unknown.
func TestUnknownOutcome(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	h := newHarness(t, nil)
	ctx := idemretry.WithRequestOptions(context.Background(), idemretry.RequestKeyWindow(time.Second))
	_, _, err := h.post(ctx, srv.URL+"/payments", action, `{"amount":100}`)
	if !errors.Is(err, idemretry.ErrKeyWindowExpired) {
		t.Fatalf("post: %v, want ErrKeyWindowExpired", err)
	}
	s := h.span()
	wantAttrs(t, "span", s.Attributes(), otelidemretry.ReasonKey.String("key_window_expired"))
	st := h.tr.Unwrap().Stats()
	rm := h.collect()
	checkStats(t, rm, st)
	if n := sum(t, rm, "idemretry.unknown", otelidemretry.ReasonKey.String("key_window_expired")); n != 1 || st.Unknown != 1 {
		t.Errorf("unknown{key_window_expired} = %d, Stats.Unknown %d; want 1", n, st.Unknown)
	}
	h.checkNoSecrets(srv.onlyKey(t), action)
}

// A large payment (keyed fingerprint) left pending; its journal's
// fingerprint.key is deleted; the resend is refused with an *ActionError,
// nothing sent. The span names why, as it does for a fingerprint
// mismatch: idemretry.reason fingerprint_uncheckable. (Found in review hK2.)
func TestUncheckableFingerprintReason(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusServiceUnavailable) })
	h := newHarness(t, nil, idemretry.WithMaxRetries(0))
	body := `{"amount":100,"note":"` + strings.Repeat("x", 80<<10) + `"}`
	resp, _, err := h.post(context.Background(), srv.URL+"/payments", action, body)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first post: %v %v", resp, err)
	}
	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(h.dir, "fingerprint.key")); err != nil {
		t.Fatal(err)
	}
	h.tr = h.transport(idemretry.WithMaxRetries(0))
	_, _, err = h.post(context.Background(), srv.URL+"/payments", action, body)
	if err == nil {
		t.Skip("this CPU makes plain fingerprints: the resend is checked")
	}
	var ae *idemretry.ActionError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "cannot be checked") {
		t.Fatalf("resend: %v, want an *ActionError (cannot be checked)", err)
	}
	ended := h.sr.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2", len(ended))
	}
	wantAttrs(t, "span", ended[1].Attributes(), otelidemretry.ReasonKey.String("fingerprint_uncheckable"), otelidemretry.MaybeProcessedKey.Bool(true))
	srv.mu.Lock()
	sent := len(srv.keys)
	srv.mu.Unlock()
	if sent != 1 {
		t.Fatalf("%d requests sent, want 1", sent)
	}
}

// The caller's own key, under a header of its choosing, and in the URL's
// path: hashed on the span, replaced by its hash in url.full.
func TestCallerKeyHashed(t *testing.T) {
	const callerKey = "caller-key-4f1c-88aa"
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusCreated) })
	h := newHarness(t, []otelidemretry.Option{otelidemretry.WithKeyHeader("X-Pay-Key")}, idemretry.WithKeyHeader("X-Pay-Key"))
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments/"+callerKey, strings.NewReader("{}"))
	req.Header.Set("X-Pay-Key", callerKey)
	resp, err := h.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := srv.onlyKey(t); got != callerKey {
		t.Fatalf("server saw key %q, want the caller's", got)
	}
	s := h.span()
	wantAttrs(t, "span", s.Attributes(),
		otelidemretry.KeyHashKey.String(hash8(callerKey)),
		semconv.URLFullKey.String(srv.URL+"/payments/"+hash8(callerKey)))
	h.checkNoSecrets(callerKey)
}

// A caller's key in the quoted form goes out so (as written), and is
// hashed and hidden as the same key bare: one key, whatever its form
// (issue 29, item 6).
func TestCallerQuotedKeyHashed(t *testing.T) {
	const callerKey = "caller-key-quoted-7b2e"
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusCreated) })
	h := newHarness(t, nil) // bare by default: the quotes are the caller's
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments/"+callerKey, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", `"`+callerKey+`"`)
	resp, err := h.tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := srv.onlyKey(t); got != `"`+callerKey+`"` {
		t.Fatalf("server saw key %q, want the caller's, quoted", got)
	}
	wantAttrs(t, "span", h.span().Attributes(), otelidemretry.KeyHashKey.String(hash8(callerKey)),
		semconv.URLFullKey.String(srv.URL+"/payments/"+hash8(callerKey)))
	h.checkNoSecrets(callerKey)
}

// WithHashSecret hashes with HMAC, WithoutHashes records no hash.
func TestHashOptions(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusCreated) })
	for _, c := range []struct {
		name string
		opt  otelidemretry.Option
	}{{"hmac", otelidemretry.WithHashSecret([]byte("k3y"))}, {"none", otelidemretry.WithoutHashes()}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, []otelidemretry.Option{c.opt})
			id := action + "-" + c.name
			if _, _, err := h.post(context.Background(), srv.URL+"/payments", id, "{}"); err != nil {
				t.Fatal(err)
			}
			attrs := attrMap(h.span().Attributes())
			kh, hasKey := attrs[otelidemretry.KeyHashKey]
			ah, hasAction := attrs[otelidemretry.ActionHashKey]
			switch c.name {
			case "hmac":
				if !hasKey || !hasAction || ah.AsString() == hash8(id) || len(ah.AsString()) != 16 || len(kh.AsString()) != 16 {
					t.Errorf("hashes %v %v: want 16 hex digits, not the plain SHA-256", kh.Emit(), ah.Emit())
				}
			case "none":
				if hasKey || hasAction {
					t.Errorf("hashes recorded: %v %v", kh.Emit(), ah.Emit())
				}
			}
			h.checkNoSecrets(id)
		})
	}
}

// Options it cannot use: an error wrapping idemretry.ErrInvalidOption,
// with the package prefix once.
func TestInvalidOptions(t *testing.T) {
	for name, opt := range map[string]otelidemretry.Option{
		"nil tracer provider": otelidemretry.WithTracerProvider(nil),
		"nil meter provider":  otelidemretry.WithMeterProvider(nil),
		"nil propagator":      otelidemretry.WithPropagators(nil),
		"empty key header":    otelidemretry.WithKeyHeader(""),
		"bad key header":      otelidemretry.WithKeyHeader("Idempotency Key"),
		"empty secret":        otelidemretry.WithHashSecret(nil),
	} {
		in, err := otelidemretry.New(opt)
		if in != nil || !errors.Is(err, idemretry.ErrInvalidOption) || strings.Count(err.Error(), "idemretry: ") != 1 {
			t.Errorf("%s: New = %v, %v; want ErrInvalidOption with one prefix", name, in, err)
		}
	}
	_, err := otelidemretry.New(otelidemretry.WithHashSecret([]byte("k")), otelidemretry.WithoutHashes())
	if !errors.Is(err, idemretry.ErrInvalidOption) {
		t.Errorf("both hash options: %v, want ErrInvalidOption", err)
	}
}

// Concurrent payments, some retried: a span each, totals equal to Stats
// (run with -race).
func TestConcurrentPayments(t *testing.T) {
	srv := newServer(t, failOnce(http.StatusBadGateway, ""))
	h := newHarness(t, nil)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _, err := h.post(context.Background(), srv.URL+"/payments", "pay:order-"+strconv.Itoa(i), "{}")
			if err == nil && resp.StatusCode != http.StatusCreated {
				err = errors.New(resp.Status)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	spans := h.sr.Ended()
	if len(spans) != n {
		t.Fatalf("%d spans, want %d", len(spans), n)
	}
	for _, s := range spans {
		if len(s.Events()) != 2 {
			t.Errorf("span with %d events, want 2", len(s.Events()))
		}
	}
	st := h.tr.Unwrap().Stats()
	if st.Attempts != 2*n || st.Done != n {
		t.Fatalf("Stats %+v, want %d attempts and %d done", st, 2*n, n)
	}
	checkStats(t, h.collect(), st)
}

// resumer rebuilds every pending action's request from a table.
type resumer struct {
	url  string
	body string
}

func (r resumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(r.body))
}

func (resumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// A payment left pending (its server down) and resumed by a new
// Transport: a span marked idemretry.resumed, a child of Resume's, with
// its attempt; idemretry.resumed equals Stats.Resumed.
func TestResumeSpan(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	srv := newServer(t, func(w http.ResponseWriter, n int) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	h := newHarness(t, nil, idemretry.WithMaxRetries(0))
	resp, _, err := h.post(context.Background(), srv.URL+"/payments", action, `{"amount":100}`)
	if err != nil || idemretry.GiveUpReason(resp) == nil {
		t.Fatalf("post: %v %v, want a give-up", resp, err)
	}
	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	down.Store(false)
	h.sr.Reset()

	tr := h.transport()
	parentCtx, parent := h.tp.Tracer("test").Start(context.Background(), "start-up")
	results, err := tr.Resume(parentCtx, resumer{url: srv.URL + "/payments", body: `{"amount":100}`}, 1)
	parent.End()
	if err != nil || len(results) != 1 || !results[0].Sent || results[0].Status != http.StatusCreated {
		t.Fatalf("Resume: %+v, %v; want one action sent and answered 201", results, err)
	}
	var resumed []string
	for _, sp := range h.sr.Ended() {
		if sp.Name() == "start-up" {
			continue
		}
		resumed = append(resumed, sp.Name())
		wantAttrs(t, "resumed span", sp.Attributes(),
			otelidemretry.ResumedKey.Bool(true), semconv.HTTPResponseStatusCodeKey.Int(201), otelidemretry.AttemptsKey.Int(1),
			otelidemretry.ActionHashKey.String(hash8(action)), otelidemretry.KeyHashKey.String(hash8(srv.onlyKey(t))))
		if sp.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("resumed span's parent %v, want Resume's span %v", sp.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		if len(sp.Events()) != 1 {
			t.Errorf("%d attempt events, want 1", len(sp.Events()))
		}
	}
	if len(resumed) != 1 {
		t.Fatalf("resumed spans %v, want 1", resumed)
	}
	rm := h.collect()
	if n := sum(t, rm, "idemretry.resumed"); n != 1 || tr.Unwrap().Stats().Resumed != 1 {
		t.Errorf("resumed = %d, Stats.Resumed = %d; want 1", n, tr.Unwrap().Stats().Resumed)
	}
	// Both Transports' events feed the same instruments.
	total := sumStats(h.tr.Unwrap().Stats(), tr.Unwrap().Stats())
	checkStats(t, rm, total)
	h.checkNoSecrets(srv.onlyKey(t), action)
}

// The package-level NewTransport uses the global providers, and its Close
// closes its Instrumentation; a GET has a span without hashes.
func TestGlobalProviders(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { _, _ = w.Write([]byte("ok")) })
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	prevTP, prevMP := otel.GetTracerProvider(), otel.GetMeterProvider()
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tr, err := otelidemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ended := sr.Ended()
	if len(ended) != 1 || ended[0].Name() != "idemretry GET" {
		t.Fatalf("spans %v, want one named idemretry GET", ended)
	}
	attrs := ended[0].Attributes()
	wantAttrs(t, "span", attrs,
		semconv.HTTPResponseStatusCodeKey.Int(200), otelidemretry.AttemptsKey.Int(1))
	noAttr(t, "span", attrs, otelidemretry.KeyHashKey)
	noAttr(t, "span", attrs, otelidemretry.ActionHashKey)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if n := sum(t, rm, "idemretry.attempts"); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
	if _, ok := find(rm, "idemretry.journal.syncs"); !ok {
		t.Error("no journal sync metric before Close")
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if _, ok := find(rm, "idemretry.journal.syncs"); ok {
		t.Error("journal sync metric still reported after Close closed the Instrumentation")
	}
}

// A 101 Switching Protocols: its body is the upgraded connection, an
// io.ReadWriteCloser the caller writes to (a WebSocket or h2c upgrade), as
// net/http, idemretry alone and otelhttp give it; through this Transport
// too, for a GET and for a POST named by its action. The span ends when
// the caller closes it. (Issue 26, item 16.)
func TestUpgradeBodyWritable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = brw.WriteString("echo " + line)
		_ = brw.Flush()
	}))
	t.Cleanup(srv.Close)
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, method := range []string{http.MethodGet, http.MethodPost} {
		req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, "upgrade:"+method), method, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := h.tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("%s: status %d, want 101", method, resp.StatusCode)
		}
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			resp.Body.Close()
			t.Fatalf("%s: a 101's body is a %T, want an io.ReadWriteCloser", method, resp.Body)
		}
		if _, err := io.WriteString(rwc, "hi\n"); err != nil {
			t.Fatalf("%s: write: %v", method, err)
		}
		got, err := bufio.NewReader(rwc).ReadString('\n')
		if err != nil || got != "echo hi\n" {
			t.Fatalf("%s: read %q, %v; want the echo", method, got, err)
		}
		if n := len(h.sr.Ended()); n != i {
			t.Errorf("%s: %d spans ended before the body was closed, want %d", method, n, i)
		}
		rwc.Close()
		ended := h.sr.Ended()
		if len(ended) != i+1 {
			t.Fatalf("%s: %d spans ended after the body was closed, want %d", method, len(ended), i+1)
		}
		wantAttrs(t, method+" span", ended[i].Attributes(), semconv.HTTPResponseStatusCodeKey.Int(101))
		if ended[i].Status().Code != codes.Unset {
			t.Errorf("%s: span status %v, want unset", method, ended[i].Status())
		}
	}
}

// stackedBase is a base that retries by itself: it sends a request
// answered 503 once more (its own retry layer, under idemretry's).
type stackedBase struct{ inner http.RoundTripper }

func (b stackedBase) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.inner.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || req.GetBody == nil {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	again := req.Clone(req.Context())
	if again.Body, err = req.GetBody(); err != nil {
		return nil, err
	}
	return b.inner.RoundTrip(again)
}

// One attempt of idemretry's may write more than one request: a base that
// retries by itself, or net/http's own resend of a request cut on a
// reused connection. idemretry.attempts, the attempt.duration histogram's
// count and the span's idemretry.attempts count requests written, as
// Stats.Attempts does: what the server saw. (Issue 26, item 16.)
func TestAttemptsCountRequestsWritten(t *testing.T) {
	t.Run("stacked base", func(t *testing.T) {
		srv := newServer(t, failOnce(http.StatusServiceUnavailable, ""))
		h := newHarness(t, nil)
		inner := &http.Transport{}
		t.Cleanup(inner.CloseIdleConnections)
		tr, err := h.in.NewTransport(stackedBase{inner: inner}, idemretry.WithJournalDir(t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close() })
		h.tr = tr
		resp, _, err := h.post(context.Background(), srv.URL+"/payments", action, `{"amount":100}`)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("post: %v %v, want 201", resp, err)
		}
		checkRequestsWritten(t, h, srv, 2)
	})
	t.Run("net/http resend", func(t *testing.T) {
		var reqs atomic.Int32
		srv := newServer(t, func(w http.ResponseWriter, n int) {
			switch {
			case reqs.Add(1) == 1: // the warm-up: its connection stays open
				w.WriteHeader(http.StatusOK)
			case n == 1:
				hijackAndClose(w) // on the reused connection: net/http resends
			default:
				w.WriteHeader(http.StatusCreated)
			}
		})
		h := newHarness(t, nil)
		warm, err := h.client.Get(srv.URL + "/warm")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, warm.Body)
		warm.Body.Close()
		h.sr.Reset()
		before := h.tr.Unwrap().Stats()
		resp, _, err := h.post(context.Background(), srv.URL+"/payments", action, `{"amount":100}`)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("post: %v %v, want 201", resp, err)
		}
		if got := h.tr.Unwrap().Stats().Attempts - before.Attempts; got != 2 {
			t.Skipf("net/http wrote %d requests, not 2: it did not resend by itself here", got)
		}
		checkRequestsWritten(t, h, srv, 3)
	})
}

// checkRequestsWritten checks that the payment's span and the metrics
// count the requests srv saw for its key (want in all, with any before).
func checkRequestsWritten(t *testing.T, h *harness, srv *server, want int) {
	t.Helper()
	srv.mu.Lock()
	seen := len(srv.keys)
	srv.mu.Unlock()
	st := h.tr.Unwrap().Stats()
	if seen != want || st.Attempts != int64(want) {
		t.Fatalf("server saw %d requests, Stats.Attempts %d; want %d", seen, st.Attempts, want)
	}
	key := srv.keys[len(srv.keys)-1]
	s := h.span()
	wantAttrs(t, "span", s.Attributes(), otelidemretry.AttemptsKey.Int(2), semconv.HTTPResponseStatusCodeKey.Int(201))
	if len(s.Events()) != 1 {
		t.Errorf("%d attempt events, want 1 (one attempt of idemretry's)", len(s.Events()))
	}
	rm := h.collect()
	checkStats(t, rm, st)
	h.checkNoSecrets(key, action)
}

// A caller's key is hashed and never recorded under any spelling of its
// header: h["idempotency-key"] set directly is sent as is, and idemretry
// takes it as the key. Here the journal is closed, so the request fails
// before any attempt, with the key in the error. (Issue 26, item 16.)
func TestCallerKeyAnySpelling(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusCreated) })
	for _, spelling := range []string{"Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY", "idempotency-KEY"} {
		t.Run(spelling, func(t *testing.T) {
			callerKey := "caller-key-" + strings.ToLower(spelling) + "-5e1d"
			h := newHarness(t, nil)
			j := journal.NewMemory()
			tr, err := h.in.NewTransport(nil, idemretry.WithJournal(j))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tr.Close() })
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments/"+callerKey, strings.NewReader("{}"))
			req.Header[spelling] = []string{callerKey}
			_, err = tr.RoundTrip(req)
			if err == nil {
				t.Fatal("RoundTrip over a closed journal: no error")
			}
			if !strings.Contains(err.Error(), callerKey) {
				t.Fatalf("the error %q does not hold the key: the test would prove nothing", err)
			}
			s := h.span()
			if s.Status().Code != codes.Error {
				t.Errorf("span status %v, want Error", s.Status())
			}
			wantAttrs(t, "span", s.Attributes(), otelidemretry.KeyHashKey.String(hash8(callerKey)),
				semconv.URLFullKey.String(srv.URL+"/payments/"+hash8(callerKey)))
			h.checkNoSecrets(callerKey)
			srv.mu.Lock()
			sent := len(srv.keys)
			srv.mu.Unlock()
			if sent != 0 {
				t.Fatalf("%d requests sent over a closed journal", sent)
			}
		})
	}
	// Two spellings at once: idemretry refuses the request (two keys);
	// neither is recorded, nor hashed (there is no one key to name).
	t.Run("two spellings", func(t *testing.T) {
		const first, second = "caller-key-first-77ab", "caller-key-second-91cd"
		h := newHarness(t, nil)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments/"+first+"/"+second, strings.NewReader("{}"))
		req.Header["Idempotency-Key"] = []string{first}
		req.Header["idempotency-key"] = []string{`"` + second + `"`}
		if _, err := h.tr.RoundTrip(req); !errors.Is(err, idemretry.ErrInvalidKey) {
			t.Fatalf("RoundTrip: %v, want ErrInvalidKey", err)
		}
		noAttr(t, "span", h.span().Attributes(), otelidemretry.KeyHashKey)
		h.checkNoSecrets(first, second)
	})
	// One key the start of the other: the longer is replaced whole, not
	// left with its tail after the shorter's hash.
	t.Run("one key the start of another", func(t *testing.T) {
		const short, long = "caller-key-5c", "caller-key-5c-and-more-0f"
		h := newHarness(t, nil)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments/"+long, strings.NewReader("{}"))
		req.Header["Idempotency-Key"] = []string{short}
		req.Header["idempotency-key"] = []string{long}
		if _, err := h.tr.RoundTrip(req); !errors.Is(err, idemretry.ErrInvalidKey) {
			t.Fatalf("RoundTrip: %v, want ErrInvalidKey", err)
		}
		wantAttrs(t, "span", h.span().Attributes(), semconv.URLFullKey.String(srv.URL+"/payments/"+hash8(long)))
		h.checkNoSecrets(short, long, "-and-more-0f")
	})
}

// Each reservation of a key (for a file journal, a write and an
// fdatasync before the first attempt leaves) is a value of
// idemretry.journal.reserve.duration, each sync the Transport asks for
// one of idemretry.journal.sync.duration: counts and sums equal to Stats.
// (Issue 30, item 7: the syncs were 0 and the reservations not exported.)
func TestJournalLatency(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusCreated) })
	h := newHarness(t, nil)
	for i := range 3 {
		if _, _, err := h.post(context.Background(), srv.URL+"/payments", action+"-"+strconv.Itoa(i), "{}"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := h.post(context.Background(), srv.URL+"/payments", "", `{"amount":7}`); err != nil {
		t.Fatal(err) // named by its fingerprint: its done is synced
	}
	st := h.tr.Unwrap().Stats()
	if st.Reserves != 4 || st.Syncs != 1 {
		t.Fatalf("Stats: %d reserves, %d syncs; want 4 and 1", st.Reserves, st.Syncs)
	}
	rm := h.collect()
	checkStats(t, rm, st)
	if n := histCount(t, rm, "idemretry.journal.reserve.duration"); n != 4 {
		t.Errorf("idemretry.journal.reserve.duration holds %d values, want 4", n)
	}
	if n := histCount(t, rm, "idemretry.journal.sync.duration"); n != 1 {
		t.Errorf("idemretry.journal.sync.duration holds %d values, want 1", n)
	}
}

// error.type says what an attempt's error means, by the semantic
// conventions' rule: a type's full name, else a documented low-cardinality
// identifier; never errors.errorString. A dropped connection is io.EOF,
// a timeout is timeout. (Issue 30, item 7.)
func TestAttemptErrorType(t *testing.T) {
	block := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, n int) {
		if n == 1 {
			hijackAndClose(w)
			return
		}
		<-block // no answer until the client gives up
	})
	t.Cleanup(func() { close(block) })
	h := newHarness(t, nil)
	base := &http.Transport{DisableKeepAlives: true, ResponseHeaderTimeout: 50 * time.Millisecond}
	tr, err := h.in.NewTransport(base, idemretry.WithJournalDir(t.TempDir()), fastBackOff(), idemretry.WithMaxRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	h.tr = tr
	_, _, err = h.post(context.Background(), srv.URL+"/payments", action, "{}")
	if !errors.Is(err, idemretry.ErrAttemptsExhausted) {
		t.Fatalf("post: %v, want ErrAttemptsExhausted", err)
	}
	s := h.span()
	evs := s.Events()
	if len(evs) != 2 {
		t.Fatalf("%d attempt events, want 2", len(evs))
	}
	for i, want := range []string{"io.EOF", "timeout"} {
		wantAttrs(t, "attempt "+strconv.Itoa(i+1), evs[i].Attributes, semconv.ErrorTypeKey.String(want))
	}
	rm := h.collect()
	checkStats(t, rm, tr.Unwrap().Stats())
	for _, want := range []string{"io.EOF", "timeout"} {
		if n := sum(t, rm, "idemretry.attempts", semconv.ErrorTypeKey.String(want)); n != 1 {
			t.Errorf("idemretry.attempts{error.type=%s} = %d, want 1", want, n)
		}
	}
	h.checkNoSecrets(srv.onlyKey(t), action)
}

// errBase is a base whose every attempt fails with err.
type errBase struct{ err error }

func (b errBase) RoundTrip(*http.Request) (*http.Response, error) { return nil, b.err }

// typedError names its own error.type.
type typedError struct{}

func (typedError) Error() string     { return "typed" }
func (typedError) ErrorType() string { return "payments_gateway_down" }

// listError is an error of an uncomparable type.
type listError []string

func (e listError) Error() string { return strings.Join(e, "; ") }

// timeoutError is a net.Error that timed out.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// error.type for the errors a base may return, through the wrappers that
// classify nothing, as errorType documents.
func TestErrorTypeNames(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{io.EOF, "io.EOF"},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), "io.ErrUnexpectedEOF"},
		{&url.Error{Op: "Post", URL: "http://x", Err: io.EOF}, "io.EOF"},
		{errors.Join(errors.New("first"), context.Canceled), "context.Canceled"},
		{fmt.Errorf("dial: %w", timeoutError{}), "timeout"},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, "net.OpError"},
		{fmt.Errorf("journal: %w", journal.ErrUnavailable), "github.com/idemretry/idemretry/journal.ErrUnavailable"},
		{typedError{}, "payments_gateway_down"},
		{listError{"a", "b"}, "github.com/idemretry/idemretry/otelidemretry_test.listError"},
		{errors.New("something"), "_OTHER"},
		{fmt.Errorf("wrapped: %w", errors.New("something")), "_OTHER"},
	} {
		h := newHarness(t, nil)
		tr, err := h.in.NewTransport(errBase{c.err}, idemretry.WithJournal(journal.NewMemory()), idemretry.WithMaxRetries(0))
		if err != nil {
			t.Fatal(err)
		}
		h.tr = tr
		if _, _, err := h.post(context.Background(), "http://127.0.0.1:1/payments", action, "{}"); err == nil {
			t.Fatalf("%v: no error", c.err)
		}
		evs := h.span().Events()
		if len(evs) != 1 {
			t.Fatalf("%v: %d attempt events, want 1", c.err, len(evs))
		}
		wantAttrs(t, fmt.Sprintf("%T %v", c.err, c.err), evs[0].Attributes, semconv.ErrorTypeKey.String(c.want))
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A pending action named by the caller's key, its key in the URL's path,
// resumed from a request rebuilt without the key header (idemretry sets it
// from the record): the resumed span's url.full has the key's hash, not
// the key.
func TestResumeSpanHidesRecordKey(t *testing.T) {
	const callerKey = "caller-key-resumed-3b7e"
	var down atomic.Bool
	down.Store(true)
	srv := newServer(t, func(w http.ResponseWriter, n int) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	h := newHarness(t, nil, idemretry.WithMaxRetries(0))
	url := srv.URL + "/payments/" + callerKey
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	req.Header.Set("Idempotency-Key", callerKey)
	resp, err := h.tr.RoundTrip(req)
	if err != nil || idemretry.GiveUpReason(resp) == nil {
		t.Fatalf("post: %v %v, want a give-up", resp, err)
	}
	resp.Body.Close()
	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	down.Store(false)
	h.sr.Reset()
	tr := h.transport()
	results, err := tr.Resume(context.Background(), resumer{url: url, body: `{"amount":100}`}, 1)
	if err != nil || len(results) != 1 || !results[0].Sent || results[0].Status != http.StatusCreated {
		t.Fatalf("Resume: %+v, %v; want one action sent and answered 201", results, err)
	}
	if got := srv.onlyKey(t); got != callerKey {
		t.Fatalf("server saw key %q, want the caller's", got)
	}
	s := h.span()
	wantAttrs(t, "resumed span", s.Attributes(), otelidemretry.ResumedKey.Bool(true),
		otelidemretry.KeyHashKey.String(hash8(callerKey)),
		semconv.URLFullKey.String(srv.URL+"/payments/"+hash8(callerKey)))
	h.checkNoSecrets(callerKey)
}
