package idemretry

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	root "github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Action is an action a previous run (or this one) left unfinished: sent,
// or about to be, with no final answer recorded.
type Action struct {
	// ActionID is the id the action was sent with, or "key:" and the key
	// for an action the app named with its own Idempotency-Key header.
	ActionID string
	// Key is its Idempotency-Key: with it the app can ask the server what
	// became of the action.
	Key string
	// CreatedAtMillis is when the key was made, in milliseconds since
	// 1970-01-01 UTC.
	CreatedAtMillis int64
	// Attempts counts the requests sent under Key, as far as recorded.
	Attempts int32
	// OutcomeUnknown is true when the key window ended with no final
	// answer, or the server refused the key as used for another payload:
	// the server may have performed the action (and may have forgotten
	// the key), so the action is never sent again. Ask the server
	// what became of it, then Forget it. When false, the action is pending:
	// send it again with the same ActionID (Resume does).
	OutcomeUnknown bool
}

// ActionList is a list of actions: Len of them, Get(0) to Get(Len()-1).
type ActionList struct {
	items []*Action
}

// Len returns the number of actions.
func (l *ActionList) Len() int32 { return int32(len(l.items)) }

// Get returns action i (0 to Len()-1), or null if there is none.
func (l *ActionList) Get(i int32) *Action { return itemAt(l.items, i) }

// itemAt returns items[i], or nil when i is out of range: the Get of the
// list types, which gobind needs as named types of their own (it binds no
// generic type).
func itemAt[T any](items []*T, i int32) *T {
	if i < 0 || int(i) >= len(items) {
		return nil
	}
	return items[i]
}

// Unfinished lists the actions left unfinished, oldest first: pending ones
// (resend them with the same ActionID, or let Resume do it) and ones whose
// outcome is unknown (reconcile, then Forget).
func (c *Client) Unfinished() (*ActionList, error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.busy.Done()
	ctx, cancel := context.WithTimeout(c.ctx, journalCallTimeout)
	defer cancel()
	recs, err := c.transport.Journal().Unfinished(ctx)
	if err != nil {
		return nil, journalFailure(err, "unfinished")
	}
	l := &ActionList{items: make([]*Action, 0, len(recs))}
	for _, r := range recs {
		l.items = append(l.items, &Action{
			ActionID:        r.ActionID,
			Key:             r.Key,
			CreatedAtMillis: r.CreatedAt.UnixMilli(),
			Attempts:        clampInt32(r.Attempts),
			OutcomeUnknown:  r.State == journal.StateUnknown,
		})
	}
	return l, nil
}

// Rebuilder is implemented by the app: it rebuilds the request of an
// unfinished action from its id, for Resume. The journal keeps ids and
// keys, never requests (no bodies, headers or credentials), so the app
// keeps what it needs to rebuild them (an order in its database, say).
type Rebuilder interface {
	// Rebuild returns the request of actionID: the same method, URL and
	// body as when it was first sent (another payload under the same id,
	// or a method other than POST and PATCH, fails with
	// KindFingerprintMismatch, nothing sent), with fresh credentials if they
	// changed. Its ActionID may be left empty: Resume names it actionID
	// (for an action listed as "key:" and a key of the app's own, it sets
	// that Idempotency-Key header). A request that names another action,
	// by its ActionID or by an Idempotency-Key header with another key,
	// is refused with KindInvalidRequest and nothing is sent: it would be
	// a second payment under a new key. Return
	// null to leave the action pending and unsent for now (an id the app
	// does not know, say), or throw to report why it cannot be rebuilt.
	Rebuild(actionID string) (*Request, error)
}

// Outcome is what became of one action in Resume: a Response, or a
// Failure, or neither when it was Skipped.
type Outcome struct {
	// ActionID is the action's id, as Unfinished lists it.
	ActionID string
	// Response is the server's final answer, or null. Its Replayed is
	// true when the server had performed the action before, in the run
	// that left it unfinished.
	Response *Response
	// Failure says why there is no Response, or is null: what Send would
	// have thrown, or, when Skipped, the error Rebuild threw (KindOther,
	// its message). Either way its ActionID, Key, Attempts and
	// MaybeProcessed are the action's, as Unfinished listed it when the
	// error does not say more.
	Failure *Failure
	// Skipped is true when nothing was sent: Rebuild returned null or
	// threw, the action was forgotten (Forget) since Resume listed it
	// (Failure null), or the action's outcome is unknown (Failure then has
	// KindWindowExpired, or KindOutcomeUnknown when its key window has
	// not ended: reconcile it, then Forget it).
	Skipped bool
}

// OutcomeList is a list of outcomes: Len of them, Get(0) to Get(Len()-1).
type OutcomeList struct {
	items []*Outcome
}

// Len returns the number of outcomes.
func (l *OutcomeList) Len() int32 { return int32(len(l.items)) }

// Get returns outcome i (0 to Len()-1), or null if there is none.
func (l *OutcomeList) Get(i int32) *Outcome { return itemAt(l.items, i) }

// Resume sends again, one after the other and with their old keys, the
// actions a previous run left pending, each rebuilt by rebuilder, and
// returns an outcome per unfinished action, oldest first. Call it once at
// start, after NewClient and before new Sends of the same actions, from a
// background thread: it waits for each answer. An action the server
// performed before the app died gets its stored answer (Response.Replayed);
// one that never reached it is performed now, once.
//
// It fails only when the journal cannot be listed or the Client is closed;
// each action's own error is in its Outcome. Closed while it runs, it calls
// Rebuild no more: the actions left are skipped with KindClosed.
func (c *Client) Resume(rebuilder Rebuilder) (*OutcomeList, error) {
	if rebuilder == nil {
		return nil, invalid("null rebuilder")
	}
	actions, err := c.Unfinished()
	if err != nil {
		return nil, err
	}
	out := &OutcomeList{items: make([]*Outcome, 0, len(actions.items))}
	for _, a := range actions.items {
		out.items = append(out.items, c.resumeOne(rebuilder, a))
	}
	return out, nil
}

func (c *Client) resumeOne(rebuilder Rebuilder, a *Action) *Outcome {
	o := &Outcome{ActionID: a.ActionID}
	if a.OutcomeUnknown {
		// As Send would say it: the window's end, judged by the time the
		// Transport judges it by (now), or, while the key window lasts
		// by that time, the other reason (the server refused the key as
		// used for another payload, or a clock set back by more than the
		// journal's time is believed).
		f := newFailure(KindWindowExpired, root.ErrKeyWindowExpired,
			"action "+quote(a.ActionID)+": key window expired with no final answer: reconcile it with the server, then Forget it")
		if c.now().Before(time.UnixMilli(a.CreatedAtMillis).Add(c.window)) {
			f = newFailure(KindOutcomeUnknown, root.ErrOutcomeUnknown,
				"action "+quote(a.ActionID)+": outcome unknown (the server refused its key, or the clock was set back more than a day): reconcile it with the server, then Forget it")
		}
		f.f.ActionID, f.f.Key, f.f.Attempts, f.f.MaybeProcessed = a.ActionID, a.Key, a.Attempts, true
		o.Failure, o.Skipped = &f.f, true
		return o
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// The app is exiting: its Rebuilder is not called any more.
		f := newFailure(KindClosed, journal.ErrClosed, "client closed")
		o.Failure, o.Skipped = listed(&f.f, a), true
		return o
	}
	defer c.mark(a.ActionID)() // Forget refuses it from now on
	if !c.stillListed(a) {
		// Forgotten (reconciled) since Unfinished listed it, or made
		// again under another key: not Resume's to send.
		o.Skipped = true
		return o
	}
	req, err := rebuilder.Rebuild(a.ActionID)
	if err != nil {
		o.Failure, o.Skipped = listed(FailureOf(err), a), true
		return o
	}
	if req == nil {
		o.Skipped = true
		return o
	}
	r := *req
	if !strings.EqualFold(r.Method, http.MethodPost) && !strings.EqualFold(r.Method, http.MethodPatch) {
		// Only POST and PATCH are journaled: another method is not the
		// action's, and would go out without its key, unchecked.
		f := newFailure(KindFingerprintMismatch, root.ErrFingerprintMismatch,
			"action "+quote(a.ActionID)+": rebuilt as "+quote(r.Method)+", not the POST or PATCH it was sent as")
		f.f.ActionID, f.f.Key, f.f.Attempts, f.f.MaybeProcessed = a.ActionID, a.Key, a.Attempts, true
		o.Failure = &f.f
		return o
	}
	if named := rebuiltAction(&r, a); named != a.ActionID {
		// Sent, it would be another action, under another key, while
		// this one may have been performed under its own: a second
		// payment. Nothing is sent; the action stays pending.
		f := invalid("rebuilt request of action " + quote(a.ActionID) + " names action " + quote(named))
		f.f.ActionID, f.f.Key, f.f.Attempts, f.f.MaybeProcessed = a.ActionID, a.Key, a.Attempts, true
		o.Failure = &f.f
		return o
	}
	resp, err := c.Send(&r)
	if err != nil {
		o.Failure = listed(FailureOf(err), a)
		return o
	}
	o.Response = resp
	return o
}

// listed completes f, a failure of Resume about a, with what Unfinished
// listed of a where f does not know better (a closed journal cannot say):
// its id and key, its attempts, and that it may have been processed (the
// journal held it). It returns f.
func listed(f *Failure, a *Action) *Failure {
	if f.ActionID == "" {
		f.ActionID = a.ActionID
	}
	if f.Key == "" {
		f.Key = a.Key
	}
	if f.Key == a.Key {
		f.Attempts = max(f.Attempts, a.Attempts)
		f.MaybeProcessed = true
	}
	return f
}

// now is the time the Transport judges key windows by, so that Resume
// says of an action what Send would: the clock, or the journal's time
// (journal.Timekeeper: the latest time it has seen, persisted) when the
// clock is behind it (set back) by no more than journal.DefaultGrace.
// It is the rule of Transport.now in the root module (clock.go), which
// does not export it; TestResumeWindowExpiredAfterClockSetBack checks that
// the two agree.
func (c *Client) now() time.Time {
	now := time.Now()
	if tk, ok := c.transport.Journal().(journal.Timekeeper); ok {
		if seen := tk.Now(); seen.After(now) && seen.Sub(now) <= journal.DefaultGrace {
			return seen
		}
	}
	return now
}

// stillListed reports whether the journal holds a under the key Unfinished
// listed it with (or cannot say: the Send then finds out).
func (c *Client) stillListed(a *Action) bool {
	g, ok := c.transport.Journal().(journal.Getter)
	if !ok {
		return true
	}
	ctx, cancel := context.WithTimeout(c.ctx, journalCallTimeout)
	defer cancel()
	rec, found, err := g.Get(ctx, a.ActionID)
	return err != nil || (found && rec.Key == a.Key)
}

// rebuiltAction returns the action r names, as Send would know it: "key:"
// and its Idempotency-Key header's key (bare or quoted) if it has one, else
// its ActionID; left unnamed, it is given a's name first: its ActionID, or,
// for an action the app named with a key of its own, that key's header.
func rebuiltAction(r *Request, a *Action) string {
	if !r.Headers.Has(root.DefaultKeyHeader) {
		id := r.ActionID
		if id == "" {
			id = a.ActionID
		}
		if id != a.ActionID {
			return id
		}
		if key, own := strings.CutPrefix(id, keyActionPrefix); own {
			h := &Headers{}
			if r.Headers != nil {
				h.lines = slices.Clone(r.Headers.lines)
			}
			h.Set(root.DefaultKeyHeader, key)
			r.Headers, r.ActionID = h, ""
		} else {
			r.ActionID = id
		}
		return id
	}
	key, _ := ownKey(r.Headers)
	for _, l := range r.Headers.lines {
		if strings.EqualFold(l.name, root.DefaultKeyHeader) && bareKey(l.value) != key {
			return keyActionPrefix + key + " and " + keyActionPrefix + bareKey(l.value)
		}
	}
	if r.ActionID == a.ActionID {
		r.ActionID = "" // "key:...": the header names it
	}
	return keyActionPrefix + key
}

// ownKey returns the key of the first Idempotency-Key line of h, bare, if
// it has one.
func ownKey(h *Headers) (string, bool) {
	if !h.Has(root.DefaultKeyHeader) {
		return "", false
	}
	return bareKey(h.Get(root.DefaultKeyHeader)), true
}

// bareKey returns an Idempotency-Key header's value as the Transport knows
// the key: bare, its IETF draft quotes taken off.
func bareKey(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	return v
}

// keyActionPrefix starts the id of an action named by the app's own
// Idempotency-Key header.
const keyActionPrefix = "key:"
