package otelidemretry

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemretry/idemretry"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
)

// Attribute keys of this package.
const (
	AttemptsKey       = attribute.Key("idemretry.attempts")
	AttemptKey        = attribute.Key("idemretry.attempt")
	AttemptDuration   = attribute.Key("idemretry.attempt.duration")
	ReplayedKey       = attribute.Key("idemretry.replayed")
	ReasonKey         = attribute.Key("idemretry.reason")
	MaybeProcessedKey = attribute.Key("idemretry.maybe_processed")
	KeyHashKey        = attribute.Key("idemretry.key.hash")
	ActionHashKey     = attribute.Key("idemretry.action.hash")
	ResumedKey        = attribute.Key("idemretry.resumed")
)

// AttemptEvent is the name of the span event of each attempt.
const AttemptEvent = "idemretry.attempt"

// instruments are the Instrumentation's metric instruments.
type instruments struct {
	attempts, retries, done, giveUps, parked, unknown, resumed metric.Int64Counter
	attemptDuration, reserveDuration, syncDuration             metric.Float64Histogram
	reserves, syncs                                            metric.Int64ObservableCounter
}

func (m *instruments) init(meter metric.Meter) error {
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	m.attempts = counter("idemretry.attempts", "{attempt}", "Requests written (a base's own resends included), and attempts that wrote none.")
	m.retries = counter("idemretry.retries", "{retry}", "Retries scheduled.")
	m.done = counter("idemretry.done", "{action}", "Actions that got a final answer, by whether it was a replay.")
	m.giveUps = counter("idemretry.give_ups", "{action}", "Actions whose attempts ended without a final answer, by reason; they stay pending with their keys.")
	m.parked = counter("idemretry.parked", "{action}", "Actions parked by the retry budget; they stay pending with their keys.")
	m.unknown = counter("idemretry.unknown", "{action}", "Actions whose outcome became unknown (to reconcile), by reason.")
	m.resumed = counter("idemretry.resumed", "{action}", "Pending actions that Resume sent again.")
	histogram := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	m.attemptDuration = histogram("idemretry.attempt.duration",
		"How long each request written took, to its response's headers or its error (an attempt's share, for a base's resends).",
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
	// A sync takes from tens of microseconds (a fast SSD, or nothing to
	// write) to a second (a saturated disk, a network file system).
	journalBounds := []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	m.reserveDuration = histogram("idemretry.journal.reserve.duration",
		"How long each reservation of a key took on the request path (for a durable journal that creates the record, its write and sync).",
		journalBounds...)
	m.syncDuration = histogram("idemretry.journal.sync.duration",
		"How long each journal sync the Transport asked for took on the request path.", journalBounds...)
	var err error
	m.reserves, err = meter.Int64ObservableCounter("idemretry.journal.reserves", metric.WithUnit("{reservation}"),
		metric.WithDescription("Reservations of a key on the request path (for a durable journal that creates the record, each a write and a sync)."))
	errs = append(errs, err)
	m.syncs, err = meter.Int64ObservableCounter("idemretry.journal.syncs", metric.WithUnit("{sync}"),
		metric.WithDescription("Journal syncs the Transport asked for on the request path (not those inside a reservation)."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("otelidemretry: create instruments: %w", err)
	}
	return nil
}

// observe is the Observer that feeds the metrics. Events come without a
// context, so none is recorded with them.
func (in *Instrumentation) observe(ev idemretry.Event) {
	ctx := context.Background()
	m := &in.m
	switch ev.Kind {
	case idemretry.EventAttempt:
		// Each request written is one, as Stats.Attempts counts them: the
		// server saw them all. Only the attempt is timed, so the requests
		// of one share its time.
		n := max(1, ev.Requests)
		set := metric.WithAttributeSet(outcomeSet(ev.Status, ev.Err))
		m.attempts.Add(ctx, int64(n), set)
		share := ev.Elapsed.Seconds() / float64(n)
		for range n {
			m.attemptDuration.Record(ctx, share, set)
		}
	case idemretry.EventRetry:
		m.retries.Add(ctx, 1, metric.WithAttributeSet(outcomeSet(ev.Status, ev.Err)))
	case idemretry.EventDone:
		if ev.Replayed {
			m.done.Add(ctx, 1, replayedTrue)
		} else {
			m.done.Add(ctx, 1, replayedFalse)
		}
	case idemretry.EventGiveUp:
		m.giveUps.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(ReasonKey.String(giveUpReason(ev.Reason)))))
	case idemretry.EventParked:
		m.parked.Add(ctx, 1)
	case idemretry.EventUnknown:
		m.unknown.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(ReasonKey.String(reasonName(ev.Reason)))))
	case idemretry.EventResumed:
		m.resumed.Add(ctx, 1)
	case idemretry.EventReserve:
		m.reserveDuration.Record(ctx, ev.Elapsed.Seconds())
	case idemretry.EventSync:
		m.syncDuration.Record(ctx, ev.Elapsed.Seconds())
	}
}

var (
	replayedTrue  = metric.WithAttributeSet(attribute.NewSet(ReplayedKey.Bool(true)))
	replayedFalse = metric.WithAttributeSet(attribute.NewSet(ReplayedKey.Bool(false)))
)

// outcomeSet says how an attempt ended: its status, or its error's type.
func outcomeSet(status int, err error) attribute.Set {
	switch {
	case status != 0:
		return attribute.NewSet(semconv.HTTPResponseStatusCode(status))
	case err != nil:
		return attribute.NewSet(errorType(err))
	}
	return attribute.NewSet()
}

// giveUpReason names a give-up's reason as Stats counts it.
func giveUpReason(reason error) string {
	switch reason {
	case idemretry.ErrAttemptsExhausted, idemretry.ErrRetryAfterTooLong, idemretry.ErrWaitExceedsDeadline:
		return reasonName(reason)
	}
	return "other"
}

// reasons names the reasons that idemretry reports.
var reasons = []struct {
	err  error
	name string
}{
	{idemretry.ErrAttemptsExhausted, "attempts_exhausted"},
	{idemretry.ErrRetryAfterTooLong, "retry_after_too_long"},
	{idemretry.ErrWaitExceedsDeadline, "wait_exceeds_deadline"},
	{idemretry.ErrParked, "parked"},
	{idemretry.ErrKeyWindowExpired, "key_window_expired"},
	{idemretry.ErrKeyReused, "key_reused"},
	{idemretry.ErrFingerprintMismatch, "fingerprint_mismatch"},
	{idemretry.ErrFingerprintUncheckable, "fingerprint_uncheckable"},
	{idemretry.ErrResponseNotShared, "response_not_shared"},
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "deadline_exceeded"},
}

// reasonName names why attempts stopped; "" for nil.
func reasonName(reason error) string {
	if reason == nil {
		return ""
	}
	for _, r := range reasons {
		if errors.Is(reason, r.err) {
			return r.name
		}
	}
	return "other"
}

// observeStats reports the journal's reservation and sync counts, summed
// over the live Transports and those retired.
func (in *Instrumentation) observeStats(_ context.Context, o metric.Observer) error {
	in.mu.Lock()
	reserves, syncs := in.retired.Reserves, in.retired.Syncs
	for t := range in.live {
		s := t.Stats()
		reserves += s.Reserves
		syncs += s.Syncs
	}
	in.mu.Unlock()
	o.ObserveInt64(in.m.reserves, reserves)
	o.ObserveInt64(in.m.syncs, syncs)
	return nil
}
