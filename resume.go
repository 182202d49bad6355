package idemretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// DefaultResumeConcurrency is how many actions Resume sends at once unless
// told otherwise.
const DefaultResumeConcurrency = 4

// DefaultMaxResumeBody is how much of an answer's body a ResumeResult keeps:
// 64 KiB, enough for a payment's answer (its charge id, say). A longer body
// is cut there, and the result says so (BodyTruncated).
const DefaultMaxResumeBody = 64 << 10

// A Resumer is what an application gives Resume: the two things the journal
// cannot know, since it keeps keys and never requests.
type Resumer interface {
	// Rebuild returns the request of a pending action: the same method,
	// URL and body as when it was first sent (the journal checks the
	// fingerprint). Resume names the action itself (its WithAction id or
	// its key) unless the action was named by its fingerprint. A nil
	// request, or an error, leaves the action pending.
	Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error)
	// Resolve reconciles an action whose outcome is unknown (its key
	// window ended), for instance by asking the payment provider about
	// rec.Key, and says whether Resume may forget it. Nothing is sent.
	Resolve(ctx context.Context, rec journal.Record) (forget bool, err error)
}

// A ResumeResult says what Resume did with one unfinished action.
type ResumeResult struct {
	Record journal.Record // as the journal listed it (of a corrupt record, only its ActionID: see Resume)
	// Sent: the action was pending and an attempt of its rebuilt request,
	// with its key, may have reached the server (it was written, or its
	// connection failed after being made). A request refused before
	// anything was sent (ErrFingerprintMismatch, ErrKeyWindowExpired,
	// ErrNotResumable, ...), or one that joined the same action already in
	// flight, is not Sent.
	Sent bool
	// Status, Header and Body are the answer the rebuilt request got: the
	// final answer (also for a request that joined a flight of the
	// action), or, with Err (GiveUpReason), the last retryable one when
	// the retries stopped; Status is 0 when no answer came. Body holds at
	// most DefaultMaxResumeBody bytes, read for at most DefaultMaxDrainTime
	// (as a discarded body is drained: a body that never ends cannot hold
	// Resume up); BodyTruncated says that the body was cut, longer than
	// that, failing or stalling (the answer is recorded all the same: a
	// resend of the action gets the server's replay, body and all). A 101
	// Switching Protocols has no Body: its connection is closed unread.
	Status        int
	Header        http.Header
	Body          []byte
	BodyTruncated bool
	// Outcome is what the app does next about the action (see
	// OutcomeOf): Done with the final answer; Pending when it is to be
	// resent (no answer came, the retries stopped, or Rebuild returned no
	// request); NotSent; Refused (outcome-unknown, whether Resolve
	// reconciled it or not: Forgotten tells; or refused before sending,
	// with Err). Its Action, Key and Attempts are the record's when the
	// rebuilt request did not report them.
	Outcome Outcome
	// Forgotten: the action was outcome-unknown (listed so, or its
	// rebuilt request found its key window ended), the Resumer resolved
	// it, and it was forgotten.
	Forgotten bool
	Err       error // what went wrong with this action, or nil
}

// Resume walks the journal's unfinished actions, oldest first, at start-up
// (or at any time: it is safe while the Transport serves other requests).
// Each pending action's request is rebuilt by r and sent through the
// Transport under the usual rules (the key window, the fingerprint, the
// retry budget, one flight per action), so it goes out with its stored key
// and the server answers with the original outcome or performs it once.
// It is sent under that key or not at all, decided when it is sent: if it
// finished under that key meanwhile, it is sent again and the server
// replays its answer; if the journal then holds it under another key (it
// finished, and an identical unnamed request has since started a new
// action), or not at all (it was forgotten meanwhile: it is not brought
// back), nothing is sent and its result's Err is ErrNotResumable. Each
// outcome-unknown action is handed to r.Resolve (nothing is rebuilt or
// sent), and so is a pending one that its rebuilt request found past its
// key window and recorded outcome-unknown (nothing is sent); it is
// forgotten only if Resolve says so. Resolve is called only when no request of the action
// should be in the air (see reconcile): not before the settle time
// (WithSettleTime) after its key window has passed (ErrOutcomeUnknown until
// then), while Resume leads its flight in this Transport, and while it
// holds its lease when the journal leases (ErrLeaseHeld otherwise); the
// record is read again before Resolve and before Forget (one found done,
// forgotten, or under another key, is left alone, with ErrNotResumable).
// A panic in r's methods is raised again on the caller's goroutine once
// the other actions are done. At most concurrency actions are handled at once
// (DefaultResumeConcurrency if concurrency <= 0), and none is started once
// ctx has ended. Each answer's status, header and body (its first
// DefaultMaxResumeBody bytes) are kept in its ResumeResult, and the
// response is closed (the rest of a longer body is discarded as the
// Transport discards any: at most DefaultMaxDrain bytes read, for at most
// DefaultMaxDrainTime). Resume returns a result per action started, and an
// error only if the journal could not be listed or ctx ended.
//
// A corrupt record (see [journal.CorruptRecordsError]) does not stop the
// others: Resume handles every record the journal lists and, after their
// results, gives each corrupt record it names a result of its own, even
// once ctx has ended. That result's Record holds only the ActionID, in
// the form the journal's Forget accepts; its Err wraps
// journal.ErrCorruptRecord and says what is wrong; its Outcome is Refused
// and MaybeProcessed (an attempt of it may have been sent). Nothing of it
// is rebuilt, sent or forgotten: reconcile it with the server (and repair
// the record, or Forget it). A CorruptRecordsError that names no record
// (a nil one too), or gives more Errs than IDs, left out records it does not name: Resume
// handles the listed ones as above and returns that error too. A journal
// that fails Unfinished with any other error (or with ErrCorruptRecord
// alone) makes Resume return no result and that error.
func (t *Transport) Resume(ctx context.Context, r Resumer, concurrency int) ([]ResumeResult, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil Resumer", ErrInvalidOption)
	}
	recs, err := t.journal.Unfinished(ctx)
	var damaged []ResumeResult
	var unnamed error // records left out that ce does not name
	if err != nil {
		var ce *journal.CorruptRecordsError
		if !errors.As(err, &ce) {
			return nil, wrapf(err, "resume: list unfinished actions")
		}
		damaged = damagedResults(ce)
		if ce == nil || len(ce.IDs) == 0 || len(ce.Errs) > len(ce.IDs) {
			// A journal's error that names none, or gives more reasons
			// than ids: some records left out have no result to carry
			// them, so the caller is told with Resume's error.
			unnamed = wrapf(err, "resume: list unfinished actions: records left out unnamed")
		}
	}
	if concurrency <= 0 {
		concurrency = DefaultResumeConcurrency
	}
	out := make([]ResumeResult, len(recs), len(recs)+len(damaged))
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	// A panic of the Resumer's (or of a hook's) on one of Resume's
	// goroutines is raised again on the caller's, once the others are
	// done, where the caller can recover it.
	var panicked atomic.Pointer[any]
	for i, rec := range recs {
		if ctx.Err() != nil { // a free slot must not win over an ended ctx
			wg.Wait()
			rethrow(panicked.Load())
			return append(out[:i], damaged...), orJoin(ctx.Err(), unnamed)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			rethrow(panicked.Load())
			return append(out[:i], damaged...), orJoin(ctx.Err(), unnamed)
		}
		wg.Add(1)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					panicked.CompareAndSwap(nil, &p)
				}
				<-sem
				wg.Done()
			}()
			out[i] = t.resumeOne(ctx, r, rec)
		}()
	}
	wg.Wait()
	rethrow(panicked.Load())
	return append(out, damaged...), orJoin(ctx.Err(), unnamed)
}

// damagedResults are the results of the corrupt records ce names: each
// Refused, maybe processed (an attempt of it may have been sent), with
// what is wrong with it as Err; nothing is rebuilt, sent or forgotten.
func damagedResults(ce *journal.CorruptRecordsError) []ResumeResult {
	if ce == nil { // a journal's typed nil names no record
		return nil
	}
	out := make([]ResumeResult, len(ce.IDs))
	for i, id := range ce.IDs {
		reason := ce.Reason(i)
		// The package prefix once: a journal's reason may carry its
		// sentinel's inside ("...: idemretry: malformed record ...").
		why := strings.ReplaceAll(reason.Error(), "idemretry: ", "")
		if !strings.Contains(why, id) {
			why = fmt.Sprintf("action %q: %s", id, why)
		}
		var err error = &prefixed{msg: "resume", err: reasonSaid{why, reason}}
		out[i] = ResumeResult{
			Record:  journal.Record{ActionID: id},
			Outcome: Outcome{Kind: Refused, Action: id, MaybeProcessed: true, Reason: err},
			Err:     err,
		}
	}
	return out
}

// reasonSaid is err, said as msg.
type reasonSaid struct {
	msg string
	err error
}

func (e reasonSaid) Error() string { return e.msg }
func (e reasonSaid) Unwrap() error { return e.err }

func (t *Transport) resumeOne(ctx context.Context, r Resumer, rec journal.Record) (res ResumeResult) {
	res.Record = rec
	defer res.completeOutcome()
	if err := ctx.Err(); err != nil {
		res.Err = err // nothing is started once Resume's context has ended
		res.Outcome = listedOutcome(rec, err)
		return res
	}
	if rec.State == journal.StateUnknown {
		t.reconcile(ctx, r, rec, &res)
		res.Outcome = listedOutcome(rec, res.Err)
		return res
	}
	req, err := r.Rebuild(ctx, rec)
	if err != nil || req == nil {
		res.Err = err
		res.Outcome = listedOutcome(rec, err)
		return res
	}
	req, mark, done := t.nameForResume(ctx, req, rec)
	defer done()
	resp, err := t.RoundTrip(req)
	res.Sent = mark.sent.Load()
	res.Outcome = OutcomeOf(resp, err)
	if err != nil {
		res.Err = err
		if mark.unknown.Load() || errors.Is(err, ErrKeyWindowExpired) || errors.Is(err, ErrOutcomeUnknown) {
			// Its key window had ended, or ended during its retries
			// (here or in the flight it joined), or it had been
			// forgotten: it is outcome-unknown now, or may be, and is
			// reconciled now, not at the next Resume (reconcile reads
			// the record again first).
			t.reconcile(ctx, r, rec, &res)
		}
	} else {
		res.Status, res.Header, res.Err = resp.StatusCode, resp.Header, GiveUpReason(resp)
		t.keepBody(resp, &res, done)
	}
	if res.Sent {
		t.emit(ctx, Event{Kind: EventResumed, Action: rec.ActionID, Key: rec.Key, Status: res.Status, Err: res.Err})
	}
	return res
}

// keepBody reads resp's body into res, up to DefaultMaxResumeBody bytes,
// discards the rest as any discarded body is (at most DefaultMaxDrain
// bytes more), and closes it, all within DefaultMaxDrainTime. The outcome
// is recorded already: a body that never ends is cut by ending the
// request's context (cut), which cannot change it.
func (t *Transport) keepBody(resp *http.Response, res *ResumeResult, cut context.CancelFunc) {
	switch {
	case resp.Body == nil:
		return
	case resp.StatusCode == http.StatusSwitchingProtocols:
		// Its body is the upgraded connection, no one's once Resume
		// returns; an ended context does not cut a read of it.
		resp.Body.Close()
		return
	}
	// The Close too: a body may drain the rest on Close.
	stop := time.AfterFunc(DefaultMaxDrainTime, cut)
	defer stop.Stop()
	body, err := io.ReadAll(io.LimitReader(resp.Body, DefaultMaxResumeBody+1))
	if len(body) > DefaultMaxResumeBody {
		body, res.BodyTruncated = body[:DefaultMaxResumeBody], true
		_, _ = io.CopyN(io.Discard, resp.Body, t.cfg.maxDrain)
	}
	if err != nil {
		res.BodyTruncated = true
	}
	if len(body) > 0 {
		res.Body = body
	}
	resp.Body.Close()
}

// listedOutcome is the Outcome of rec, listed by Resume, of which nothing
// was sent, for reason (nil if none): Pending, to be resent; Refused if it
// is outcome-unknown (ErrOutcomeUnknown, unless reason says more), whether
// Resolve reconciled it or not.
func listedOutcome(rec journal.Record, reason error) Outcome {
	o := Outcome{Kind: Pending, Action: rec.ActionID, Key: rec.Key, Attempts: rec.Attempts, MaybeProcessed: true, Reason: reason}
	if rec.State == journal.StateUnknown {
		o.Kind = Refused
		if reason == nil {
			o.Reason = ErrOutcomeUnknown
		}
	}
	return o
}

// completeOutcome gives res.Outcome the action and key of the listed
// record when the rebuilt request's error did not name them (a journal's
// error, say), and its attempts if they were more.
func (res *ResumeResult) completeOutcome() {
	o := &res.Outcome
	if o.Action == "" {
		o.Action, o.Key = res.Record.ActionID, res.Record.Key
	}
	o.Attempts = max(o.Attempts, res.Record.Attempts)
}

// resumeKey marks a request Resume rebuilt, with a *resumeMark.
type resumeKey struct{}

// resumeMark is the record Resume listed for a request it rebuilt, whether
// an attempt of that request may have reached the server, and whether the
// request recorded the action outcome-unknown (its key window ended).
type resumeMark struct {
	rec     journal.Record
	sent    atomic.Bool
	unknown atomic.Bool
}

// nameForResume ties a rebuilt request to its action's record (see
// resumedIdentity). The request keeps its context's values and deadline,
// and ends when Resume's ctx does too, or when done is called. Resume's
// deadline, if earlier, is the request's: no wait that would end after it
// starts (README guarantee 5).
func (t *Transport) nameForResume(ctx context.Context, req *http.Request, rec journal.Record) (*http.Request, *resumeMark, context.CancelFunc) {
	m := &resumeMark{rec: rec}
	named := context.WithValue(req.Context(), resumeKey{}, m)
	var rctx context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		rctx, cancel = context.WithDeadline(named, dl)
	} else {
		rctx, cancel = context.WithCancel(named)
	}
	stop := context.AfterFunc(ctx, cancel)
	return req.WithContext(rctx), m, func() { stop(); cancel() }
}

// orJoin is a, or b if a is nil, or both joined if neither is.
func orJoin(a, b error) error {
	switch {
	case b == nil:
		return a
	case a == nil:
		return b
	}
	return errors.Join(a, b)
}

// rethrow panics with *p, if p is not nil.
func rethrow(p *any) {
	if p != nil {
		panic(*p)
	}
}
