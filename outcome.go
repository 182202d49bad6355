package idemretry

// This file decides how an action's attempts end: what the journal records,
// what the caller is told, what is logged. It is where hooks and metrics
// belong.

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemretry/idemretry/journal"
)

type giveUpKey struct{}

// GiveUpReason tells why RoundTrip returned a response that is not a final
// answer: the retries stopped on a retryable status (a 503, a 429, a 409...)
// and the RoundTripper contract gives the caller the last response with a
// nil error. It returns ErrAttemptsExhausted, ErrRetryAfterTooLong,
// ErrWaitExceedsDeadline, or the context's error when the caller's context
// ended; nil for a final answer, or a response that did not come from a
// Transport. The action stays pending: resend it, and it keeps its key.
func GiveUpReason(resp *http.Response) error {
	if resp == nil || resp.Request == nil {
		return nil
	}
	err, _ := resp.Request.Context().Value(giveUpKey{}).(error)
	return err
}

// markGiveUp attaches reason to resp for GiveUpReason.
func markGiveUp(resp *http.Response, out *http.Request, reason error) {
	r := resp.Request
	if r == nil {
		r = out
	}
	resp.Request = r.WithContext(context.WithValue(r.Context(), giveUpKey{}, reason))
}

// logGiveUp says at Warn that an action's retries stopped without a final
// answer, and why.
func (t *Transport) logGiveUp(ctx context.Context, actionID, key string, attempts, status int, reason, cause error) {
	if t.cfg.logger == nil {
		return
	}
	t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: gave up without a final answer",
		slog.String("action", actionID), slog.String("key", key), slog.Int("attempts", attempts),
		slog.Int("status", status), slog.Any("reason", reason), slog.Any("error", cause))
}

// logUnknown says that an action's outcome must now be reconciled by hand,
// and why (ErrKeyWindowExpired, ErrKeyReused).
func (t *Transport) logUnknown(ctx context.Context, rec journal.Record, reason error) {
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemretry: outcome unknown: reconcile the action",
			slog.String("action", rec.ActionID), slog.String("key", rec.Key), slog.Time("created", rec.CreatedAt),
			slog.Any("reason", reason))
	}
}

// retrying reports a retry about to happen and frees the attempt.
func (r *run) retrying(resp *http.Response, err error, wait time.Duration) {
	t := r.t
	ev := Event{Kind: EventRetry, Action: r.id(), Key: r.key(), Attempt: r.total(), Wait: wait, Status: statusOf(resp), Err: err}
	t.emit(r.ctx, ev)
	if t.cfg.logger != nil {
		t.cfg.logger.LogAttrs(r.ctx, slog.LevelDebug, "idemretry: retrying", slog.String("action", ev.Action),
			slog.String("key", ev.Key), slog.Int("attempt", ev.Attempt), slog.Duration("wait", ev.Wait),
			slog.Int("status", ev.Status), slog.Any("error", ev.Err))
	}
	r.discard(resp)
	if r.sent == 1 && r.a != nil {
		r.t.progress(r.ctx, r.record(journal.StatePending, 0)) // a crash during the waits keeps the count
	}
}

// end records where the action stands and returns what RoundTrip returns:
// resp if there is one (a final answer, or the last retryable one when the
// retries stop for reason), else an *ActionError. What the caller is given
// is what the journal records: done only with a final answer in hand.
// pending reports that the action is left unfinished.
func (r *run) end(state journal.State, resp *http.Response, reason, cause error) (_ *http.Response, pending bool, _ error) {
	t := r.t
	if r.a != nil {
		rec := r.record(state, 0)
		if state == journal.StateDone {
			rec.Status = statusOf(resp)
		}
		if r.a.rec.State == journal.StateDone {
			// Done is final: a resend that failed does not make a known
			// outcome unknown, nor does a replay change it.
			rec.State, rec.Status = journal.StateDone, r.a.rec.Status
		}
		// A fingerprint-named action's new done (and its 307/308 hop's)
		// must be durable before RoundTrip returns: lost, a deliberate
		// repeat after a crash would reuse the old key and be answered
		// with this payment's replay.
		if rec.State == journal.StatePending {
			t.progress(r.ctx, rec)
		} else {
			t.record(r.ctx, rec, rec.State == journal.StateDone && r.a.syncDone && r.a.rec.State != journal.StateDone)
			if rec.State == journal.StateDone && r.a.syncDone && !r.a.byFingerprint {
				t.hops.drop(rec.ActionID) // a hop, finished
			}
		}
		state = rec.State
		if state == journal.StateUnknown && r.a.resumed != nil {
			r.a.resumed.unknown.Store(true)
		}
	}
	r.report(state, resp, reason, cause)
	if resp != nil {
		if resp.Request == nil {
			resp.Request = r.out // where OutcomeOf and GiveUpReason look
		}
		if r.a != nil && r.tr != nil {
			r.a.attempts, r.tr.act = clampInt32(r.total()), r.a
		}
		if reason != nil {
			markGiveUp(resp, r.out, reason)
		}
		switch {
		case resp.Body == http.NoBody && r.tr != nil:
			// Nothing to read (a 204, a HEAD, a Content-Length: 0): the
			// base let go of the connection already. The caller gets the
			// body net/http gives, which callers compare against.
			r.tr.end()
		case resp.Body != nil && r.tr != nil:
			// The attempt's trace is the wrapper: it lives as long.
			r.tr.resp = resp.Body
			resp.Body = (*attemptBody)(r.tr)
			if resp.StatusCode == http.StatusSwitchingProtocols {
				if _, ok := r.tr.resp.(io.Writer); ok {
					resp.Body = (*upgradedBody)(r.tr) // the upgraded connection: written to as well
				}
			}
		}
		return resp, state != journal.StateDone, nil
	}
	if r.tr != nil {
		r.tr.end()
	}
	if reason == ErrKeyWindowExpired && cause == nil {
		cause = r.lastErr
	}
	return nil, state != journal.StateDone, &ActionError{Action: r.id(), Key: r.key(), Attempts: r.total(), Status: r.lastStatus,
		MaybeProcessed: r.maybe || r.afterKeyed || (r.a != nil && (!r.a.fresh || r.prior() > 0)), Reason: reason, Err: cause,
		sent: r.sent, counted: true}
}

// record returns the action's record as it stands after this run.
func (r *run) record(state journal.State, status int) journal.Record {
	rec := r.a.rec
	rec.State, rec.Attempts, rec.Status = state, r.total(), status // no further: the journals' bound
	return rec
}

func (r *run) id() string {
	if r.a == nil {
		return ""
	}
	return r.a.rec.ActionID
}

func (r *run) key() string {
	if r.a == nil {
		return ""
	}
	return r.a.rec.Key
}

// total is the action's attempts: the earlier ones and this run's,
// saturated at journal.MaxAttempts.
func (r *run) total() int { return addCount(r.prior(), r.sent) }

func (r *run) prior() int {
	if r.a == nil {
		return 0
	}
	return r.a.rec.Attempts
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// report tells the observers, the counters and the log how the attempts
// ended.
func (r *run) report(state journal.State, resp *http.Response, reason, cause error) {
	t := r.t
	ev := Event{Action: r.id(), Key: r.key(), Attempt: r.total(), Status: r.lastStatus, Err: r.lastErr, Reason: reason}
	switch {
	case state == journal.StateUnknown:
		ev.Kind = EventUnknown
		if r.a != nil {
			t.logUnknown(r.ctx, r.record(state, 0), reason)
		}
	case reason == ErrParked:
		ev.Kind = EventParked
		t.logGiveUp(r.ctx, ev.Action, ev.Key, ev.Attempt, ev.Status, reason, cause)
	case resp != nil && reason == nil:
		ev.Kind, ev.Replayed = EventDone, IsReplay(resp)
	default:
		ev.Kind = EventGiveUp
		if reason != nil {
			t.logGiveUp(r.ctx, ev.Action, ev.Key, ev.Attempt, ev.Status, reason, cause)
		}
	}
	t.emit(r.ctx, ev)
}
