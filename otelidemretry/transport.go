package otelidemretry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
)

// Transport is an instrumented idemretry Transport: an http.RoundTripper
// that starts a span per RoundTrip. It is safe for concurrent use.
type Transport struct {
	in    *Instrumentation
	t     *idemretry.Transport
	owned bool // Close closes in
	once  sync.Once
	err   error
}

var _ http.RoundTripper = (*Transport)(nil)

// Unwrap returns the idemretry Transport underneath, for Stats, Journal
// and Resume (without spans).
func (t *Transport) Unwrap() *idemretry.Transport { return t.t }

// Close closes the idemretry Transport. Its journal sync counts stay in
// the Instrumentation's totals.
func (t *Transport) Close() error {
	t.once.Do(func() {
		t.err = t.t.Close()
		t.in.retire(t.t)
		if t.owned {
			t.err = errors.Join(t.err, t.in.Close())
		}
	})
	return t.err
}

// CloseIdleConnections closes the base transport's idle connections.
func (t *Transport) CloseIdleConnections() { t.t.CloseIdleConnections() }

// roundTrip is what one span's attempts record, found in their context.
type roundTrip struct {
	span     trace.Span
	events   atomic.Int64 // attempts
	attempts atomic.Int64 // requests written, as Stats.Attempts counts them
	mu       sync.Mutex
	key      string // the key the attempts carried
}

type roundTripKey struct{}

// RoundTrip sends req through the idemretry Transport in a span; see the
// package documentation for what it records.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil || req.URL == nil {
		return t.t.RoundTrip(req) // its error, no span
	}
	action, _ := idemretry.ActionFromContext(req.Context())
	ctx, rt := t.in.start(req, action, t.in.keyOf(req.Header), nil)
	resp, err := t.t.RoundTrip(req.WithContext(ctx))
	t.in.finish(rt, req, resp, err)
	if err != nil || resp == nil {
		rt.span.End()
		return resp, err
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		rt.span.End()
		return resp, nil
	}
	body := &endOnClose{ReadCloser: resp.Body, span: rt.span}
	if w, ok := resp.Body.(io.Writer); ok {
		// A 101's body is the upgraded connection, which the caller
		// writes to (net/http makes it an io.ReadWriteCloser).
		resp.Body = &endOnCloseWriter{endOnClose: body, w: w}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// start opens the span of a RoundTrip (or of a resumed action), with what
// the request says before it is sent: the action id and the key, if known
// ("" if not), are hashed, and hidden in url.full.
func (in *Instrumentation) start(req *http.Request, action, key string, extra []attribute.KeyValue) (context.Context, *roundTrip) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	attrs := make([]attribute.KeyValue, 0, 8+len(extra))
	attrs = append(attrs, methodAttrs(method)...)
	sc := in.scrubber(req, action, key)
	attrs = append(attrs, semconv.URLFull(sc.scrub(redactURL(req.URL))))
	host, port := hostPort(req.URL)
	if host != "" {
		attrs = append(attrs, semconv.ServerAddress(host))
	}
	if port > 0 {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	if !in.noHashes {
		if action != "" {
			attrs = append(attrs, ActionHashKey.String(in.hash(action)))
		}
		if key != "" {
			attrs = append(attrs, KeyHashKey.String(in.hash(key)))
		}
	}
	attrs = append(attrs, extra...)
	ctx, span := in.tracer.Start(req.Context(), "idemretry "+method,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	rt := &roundTrip{span: span}
	return context.WithValue(ctx, roundTripKey{}, rt), rt
}

// finish records how the RoundTrip ended on its span, which it does not
// end.
func (in *Instrumentation) finish(rt *roundTrip, req *http.Request, resp *http.Response, err error) {
	span := rt.span
	rt.mu.Lock()
	key := rt.key
	rt.mu.Unlock()
	attrs := []attribute.KeyValue{AttemptsKey.Int64(rt.attempts.Load())}
	action := ""
	if id, ok := idemretry.ActionFromContext(req.Context()); ok {
		action = id
	}
	var ae *idemretry.ActionError
	if errors.As(err, &ae) {
		if ae.Key != "" {
			key = ae.Key
		}
		if ae.Action != "" {
			action = ae.Action
		}
		attrs = append(attrs, MaybeProcessedKey.Bool(ae.MaybeProcessed))
		if ae.Status != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(ae.Status))
		}
		if name := reasonName(reasonOf(ae)); name != "" {
			attrs = append(attrs, ReasonKey.String(name))
		}
	}
	if key == "" {
		key = in.keyOf(req.Header)
	}
	if !in.noHashes {
		if key != "" {
			attrs = append(attrs, KeyHashKey.String(in.hash(key)))
		}
		if action != "" {
			attrs = append(attrs, ActionHashKey.String(in.hash(action)))
		}
	}
	switch {
	case err != nil:
		sc := in.scrubber(req, action, key)
		attrs = append(attrs, errorType(err))
		span.SetAttributes(attrs...)
		span.SetStatus(codes.Error, sc.message(err))
	case resp != nil:
		attrs = append(attrs, semconv.HTTPResponseStatusCode(resp.StatusCode))
		if resp.StatusCode >= 400 {
			attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
		}
		reason := idemretry.GiveUpReason(resp)
		if reason != nil {
			attrs = append(attrs, ReasonKey.String(reasonName(reason)))
		} else {
			attrs = append(attrs, ReplayedKey.Bool(idemretry.IsReplay(resp)))
		}
		span.SetAttributes(attrs...)
		switch {
		case resp.StatusCode >= 400:
			desc := ""
			if reason != nil {
				desc = reason.Error()
			}
			span.SetStatus(codes.Error, desc)
		case reason != nil:
			span.SetStatus(codes.Error, reason.Error())
		}
	}
}

// reasonOf is why an ActionError's attempts stopped: its Reason, or the
// caller's context's error.
func reasonOf(ae *idemretry.ActionError) error {
	if ae.Reason != nil {
		return ae.Reason
	}
	if errors.Is(ae.Err, context.Canceled) || errors.Is(ae.Err, context.DeadlineExceeded) ||
		errors.Is(ae.Err, idemretry.ErrFingerprintUncheckable) {
		return ae.Err
	}
	return nil
}

// keyOf returns the key in h, unquoted, or "" if h has none or more than
// one (idemretry refuses those).
func (in *Instrumentation) keyOf(h http.Header) string {
	vs := in.keyValues(h)
	if len(vs) != 1 {
		return ""
	}
	return unquote(vs[0])
}

// keyValues returns every value of the key header in h, under any
// spelling of its name: a caller may set h["idempotency-key"] directly,
// which net/http sends as is and idemretry takes as the key.
func (in *Instrumentation) keyValues(h http.Header) []string {
	vs := h[in.keyHeader]
	for k, v := range h {
		if k != in.keyHeader && strings.EqualFold(k, in.keyHeader) {
			vs = append(vs[:len(vs):len(vs)], v...)
		}
	}
	return vs
}

// unquote is a key header's value without its spaces and quotes.
func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	return v
}

// attemptTransport is the base the idemretry Transport sends attempts
// through: it records each on its RoundTrip's span and gives it the
// span's context in its headers.
type attemptTransport struct {
	in   *Instrumentation
	base http.RoundTripper
}

func (a *attemptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rt, _ := req.Context().Value(roundTripKey{}).(*roundTrip)
	if rt == nil {
		return a.base.RoundTrip(req)
	}
	n := rt.events.Add(1)
	key := a.in.keyOf(req.Header)
	if key != "" {
		rt.mu.Lock()
		rt.key = key
		rt.mu.Unlock()
	}
	// The requests the base writes, counted as idemretry counts them
	// (Stats.Attempts): a base that retries, or net/http's resend on a
	// reused connection, writes more than one.
	var writes atomic.Int64
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { writes.Add(1) },
	})
	var out *http.Request
	if len(a.in.prop.Fields()) > 0 {
		out = req.Clone(ctx) // the headers are idemretry's
		a.in.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	} else {
		out = req.WithContext(ctx)
	}
	start := time.Now()
	resp, err := a.base.RoundTrip(out)
	end := time.Now()
	rt.attempts.Add(max(1, writes.Load()))
	attrs := []attribute.KeyValue{AttemptKey.Int64(n), AttemptDuration.Float64(end.Sub(start).Seconds())}
	switch {
	case err != nil:
		action, _ := idemretry.ActionFromContext(req.Context())
		attrs = append(attrs, errorType(err),
			semconv.ErrorMessage(a.in.scrubber(req, action, key).message(err)))
	case resp != nil:
		attrs = append(attrs, semconv.HTTPResponseStatusCode(resp.StatusCode))
	}
	rt.span.AddEvent(AttemptEvent, trace.WithTimestamp(end), trace.WithAttributes(attrs...))
	return resp, err
}

// CloseIdleConnections closes the base's idle connections, if it can.
func (a *attemptTransport) CloseIdleConnections() {
	if c, ok := a.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// endOnClose ends the span when the body is read to its end or closed.
type endOnClose struct {
	io.ReadCloser
	span  trace.Span
	ended atomic.Bool
}

func (b *endOnClose) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.end()
	}
	return n, err
}

func (b *endOnClose) Close() error {
	b.end()
	return b.ReadCloser.Close()
}

func (b *endOnClose) end() {
	if b.ended.CompareAndSwap(false, true) {
		b.span.End()
	}
}

// endOnCloseWriter is an endOnClose of a body that is also written to (a
// 101's): it stays an io.ReadWriteCloser.
type endOnCloseWriter struct {
	*endOnClose
	w io.Writer
}

func (b *endOnCloseWriter) Write(p []byte) (int, error) { return b.w.Write(p) }

// methodAttrs are http.request.method, and http.request.method_original
// for a method the conventions do not know.
func methodAttrs(m string) []attribute.KeyValue {
	switch m {
	case http.MethodConnect, http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
		http.MethodPatch, http.MethodPost, http.MethodPut, http.MethodTrace:
		return []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(m)}
	}
	return []attribute.KeyValue{semconv.HTTPRequestMethodOther, semconv.HTTPRequestMethodOriginal(m)}
}

// redactURL is u without its fragment, with REDACTED for the user name,
// the password and every query value.
func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.UserPassword("REDACTED", "REDACTED")
	}
	c.Fragment, c.RawFragment = "", ""
	if c.RawQuery != "" {
		q, err := url.ParseQuery(c.RawQuery)
		if err != nil {
			c.RawQuery = "REDACTED"
		} else {
			for k, vs := range q {
				for i := range vs {
					vs[i] = "REDACTED"
				}
				q[k] = vs
			}
			c.RawQuery = q.Encode()
		}
	}
	c.ForceQuery = false
	return c.String()
}

// hostPort is server.address and server.port: the port as given, else the
// scheme's.
func hostPort(u *url.URL) (string, int) {
	host := u.Hostname()
	if p := u.Port(); p != "" {
		port, err := strconv.Atoi(p)
		if err == nil {
			return host, port
		}
	}
	switch u.Scheme {
	case "https":
		return host, 443
	case "http":
		return host, 80
	}
	return host, 0
}

// scrubber replaces what must not be recorded in a message: the action's
// key and id (by their hashes), the URL's query and user info.
type scrubber struct {
	secrets []replacement
	pairs   []string // old, new, ..., the longer first
}

type replacement struct{ old, new string }

func (in *Instrumentation) scrubber(req *http.Request, action, key string) scrubber {
	var s scrubber
	add := func(secret, by string) {
		if secret == "" {
			return
		}
		s.secrets = append(s.secrets, replacement{secret, by})
		if q := strconv.Quote(secret); q[1:len(q)-1] != secret {
			s.secrets = append(s.secrets, replacement{q[1 : len(q)-1], by})
		}
		if e := url.QueryEscape(secret); e != secret {
			s.secrets = append(s.secrets, replacement{e, by})
		}
	}
	sub := func(id string) string {
		if in.noHashes {
			return "REDACTED"
		}
		return in.hash(id)
	}
	// Every value of the key header, under any spelling: the one
	// idemretry took, or those it refused.
	for _, v := range in.keyValues(req.Header) {
		if v = unquote(v); v != key {
			add(v, sub(v))
		}
	}
	add(action, sub(action))
	add(key, sub(key))
	if req.URL != nil {
		if req.URL.RawQuery != "" {
			add(req.URL.RawQuery, "REDACTED")
		}
		if req.URL.User != nil {
			add(req.URL.User.String(), "REDACTED")
		}
	}
	// The longer first, whole: a secret may hold another (an action id
	// holds its key, "key:" + key), and a Replacer tries its pairs in
	// order at each position.
	sort.SliceStable(s.secrets, func(i, j int) bool { return len(s.secrets[i].old) > len(s.secrets[j].old) })
	for _, p := range s.secrets {
		s.pairs = append(s.pairs, p.old, p.new)
	}
	return s
}

func (s scrubber) scrub(msg string) string {
	if len(s.pairs) == 0 {
		return msg
	}
	return strings.NewReplacer(s.pairs...).Replace(msg)
}

// message is err's message, scrubbed; an ActionError's without its
// action's name and key.
func (s scrubber) message(err error) string {
	var ae *idemretry.ActionError
	if errors.As(err, &ae) {
		c := *ae
		c.Action, c.Key = "", ""
		return s.scrub(c.Error())
	}
	return s.scrub(err.Error())
}
