package otelidemretry

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
)

// Resume is the idemretry Transport's Resume with a span for each pending
// action sent again: a child of the span in ctx, marked idemretry.resumed,
// with an event per attempt like a RoundTrip's. It ends when the action's
// response has been read, with its status, or with the error in its
// ResumeResult.
func (t *Transport) Resume(ctx context.Context, r idemretry.Resumer, concurrency int) ([]idemretry.ResumeResult, error) {
	if r == nil {
		return t.t.Resume(ctx, nil, concurrency) // its error
	}
	tr := &tracedResumer{in: t.in, r: r, open: make(map[string]*resumed)}
	results, err := t.t.Resume(ctx, tr, concurrency)
	for _, res := range results {
		if !res.Sent {
			continue
		}
		if s := tr.take(res.Record.ActionID); s != nil {
			t.in.endResumed(s, res)
		}
	}
	for _, s := range tr.rest() { // Resume ended before their results
		s.rt.span.SetStatus(codes.Error, "resume ended")
		s.rt.span.End()
	}
	return results, err
}

type resumed struct {
	rt  *roundTrip
	req *http.Request
	rec journal.Record
}

// tracedResumer starts a span for each request it rebuilds.
type tracedResumer struct {
	in   *Instrumentation
	r    idemretry.Resumer
	mu   sync.Mutex
	open map[string]*resumed
}

func (tr *tracedResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	req, err := tr.r.Rebuild(ctx, rec)
	if err != nil || req == nil || req.URL == nil {
		return req, err
	}
	// The span is a child of Resume's context, whatever the rebuilt
	// request's context carries otherwise. The record names the action
	// and its key, which the rebuilt request need not carry.
	_, rt := tr.in.start(req.WithContext(ctx), rec.ActionID, rec.Key, []attribute.KeyValue{ResumedKey.Bool(true)})
	out := req.WithContext(context.WithValue(trace.ContextWithSpan(req.Context(), rt.span), roundTripKey{}, rt))
	tr.mu.Lock()
	if old := tr.open[rec.ActionID]; old != nil { // cannot happen: one record per action
		old.rt.span.End()
	}
	tr.open[rec.ActionID] = &resumed{rt: rt, req: out, rec: rec}
	tr.mu.Unlock()
	return out, nil
}

func (tr *tracedResumer) Resolve(ctx context.Context, rec journal.Record) (bool, error) {
	return tr.r.Resolve(ctx, rec)
}

func (tr *tracedResumer) take(id string) *resumed {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.open[id]
	delete(tr.open, id)
	return s
}

func (tr *tracedResumer) rest() []*resumed {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []*resumed
	for id, s := range tr.open {
		out = append(out, s)
		delete(tr.open, id)
	}
	return out
}

// endResumed records a resumed action's result on its span and ends it.
func (in *Instrumentation) endResumed(s *resumed, res idemretry.ResumeResult) {
	span := s.rt.span
	attrs := []attribute.KeyValue{AttemptsKey.Int64(s.rt.attempts.Load())}
	if res.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(res.Status))
		if res.Status >= 400 {
			attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(res.Status)))
		}
	}
	switch {
	case res.Err != nil:
		reason := res.Err // a response's GiveUpReason, or RoundTrip's error
		var ae *idemretry.ActionError
		if errors.As(res.Err, &ae) {
			reason = reasonOf(ae)
			attrs = append(attrs, MaybeProcessedKey.Bool(ae.MaybeProcessed))
		}
		if name := reasonName(reason); name != "" {
			attrs = append(attrs, ReasonKey.String(name))
		}
		if res.Status == 0 {
			attrs = append(attrs, errorType(res.Err))
		}
		span.SetAttributes(attrs...)
		span.SetStatus(codes.Error, in.scrubber(s.req, s.rec.ActionID, s.rec.Key).message(res.Err))
	case res.Status >= 400:
		span.SetAttributes(attrs...)
		span.SetStatus(codes.Error, "")
	default:
		span.SetAttributes(attrs...)
	}
	span.End()
}
