package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/paytest"
	"github.com/idemretry/idemretry/journal"
)

// A violation is a check that a history broke.
type violation struct {
	check string
	msg   string
	tags  []string // what in the history caused it, where that can be told
}

func (v violation) String() string { return v.check + ": " + v.msg }

// The checks. Each is derived from a sentence of the README or of the
// Transport's doc comments, quoted with it.
var checks = map[string]string{
	"charged-once": "an intent is charged at most once (README: one key per logical action, the server charges it once; " +
		"an unnamed repeat after the first finished is a new payment, so a second key is right only when the call " +
		"that minted it joined after the first key's action was recorded done)",
	"told-paid-was-charged": "an intent the app was told is paid (a 2xx) was charged",
	"not-another-intents-replay": "a deliberate repeat is never answered with another intent's replay " +
		"(README, 'What an unnamed request cannot know': one after the first finished is a new action)",
	"one-key-per-action": "an action whose outcome may exist never gets a second key (guarantee 3; " +
		"a key forgotten after Resolve found it not charged may be replaced)",
	"one-body-per-key": "a key is never sent with two bodies (guarantee 9)",
	"valid-key":        "every keyed request carries exactly one valid key (guarantees 1, 2)",
	"key-form": "a key goes out in one form for good, the one it was first sent in: a minted key in WithQuotedKey's form when it was minted, " +
		"a caller's or an SDK's key as the caller wrote it on the action's first request; later requests, restarts, Resume and a switched " +
		"WithQuotedKey included (package doc, 'Actions and keys'; WithQuotedKey)",
	"journaled-key": "every request of a WithAction action goes out under the action's journaled key, whatever key the request carries " +
		"(an SDK's new key on every call is adopted only by the action's first request: WithAction)",
	"request-body-intact":   "the server receives the body the app sent",
	"one-flight":            "requests of one action in one Transport share one flight: never two of its requests in the air at once (guarantee 2)",
	"no-retry-after-cancel": "the caller's own cancellation is never retried (guarantee 4: never the caller's own cancellation)",
	"retry-after-floor":     "a retry after a Retry-After waits at least that long (README, Overload safety: Retry-After is a floor)",
	"bounded": "every call returns within its documented bound: its deadline or cancel plus OutcomeGrace " +
		"(plus a second for a lease's release), real time (guarantee 5)",
	"shared-answer": "a caller that joined a flight gets its own copy of a final answer that fits the sharing limit " +
		"and arrives within DefaultMaxShareTime (Transport.RoundTrip)",
	"answer-intact":        "the body of a final answer reaches the app whole, unless the network cut it",
	"resolve-after-settle": "Resolve is called only a settle time after the key window ended, and never while a request of the action is in the air (Transport.Resume)",
	"no-send-after-window": "no request leaves with a key past its key window, beyond the clock error the history introduced (guarantee 5)",
	"returned-is-recorded": "what RoundTrip returned is what the journal records: a final answer returned is recorded done " +
		"(guarantee 6), unless the journal failed that write (then it is held in memory)",
	"done-survives-crash": "an unnamed action's done is durable before RoundTrip returns (guarantee 2's sync of a done)",
	"done-is-final":       "an action recorded done stays done: no later write (a stale resend, a failed retry) moves it out of done (guarantee 6)",
	"no-hopeless-wait":    "no wait starts that would end after the context's deadline (guarantee 5): a retry wait longer than the time left is not made",
	"request-body-closed": "RoundTrip closes the request body (http.RoundTripper)",
	"response-or-error":   "a response or an error, never both (guarantee 7)",
	"bodies-closed":       "every response body is drained and closed: the Transport's discarded ones, and the ones it handed on once their reader closed them (guarantee 7)",
	"released-at-eof":     "an answer read to EOF releases its attempt, as net/http releases its connection (guarantee 7: nothing outlives its RoundTrip)",
	"resume-sent":         "ResumeResult.Sent is true whenever a request of the action reached the server",
	"outcome-of": "what OutcomeOf says of a call agrees with the ledger (OutcomeOf, Kind): NotSent, and Pending or Refused with " +
		"MaybeProcessed false, only when no request under its key reached the server; Done only with the final answer, " +
		"the server's for its key; its Key the key its requests went out under",
	"resume-body": "a ResumeResult's Body, not truncated, is the server's answer under the listed key: the charge it names is that key's (ResumeResult)",
}

func paytestAnswer(b []byte) (answerSeen, bool) {
	a, ok := paytest.ParseAnswer(b)
	if !ok {
		return answerSeen{}, false
	}
	return answerSeen{ok: true, charge: a.Charge, intent: a.Intent, key: a.Key}, true
}

// checkRecorded holds call c, just returned, to guarantee 6: a final answer
// returned is recorded done.
func (r *runner) checkRecorded(c *call) {
	st, final := c.final()
	p := c.proc
	if !final || p.dead.Load() || c.err != nil {
		return
	}
	key := c.answer.key
	if key == "" {
		key = r.keyOf(c)
	}
	if key == "" {
		return
	}
	id := r.actionIDOf(c.intent)
	rec, found, err := p.j.(journal.Getter).Get(context.Background(), id)
	if err != nil || !found || rec.Key != key {
		return // gone, or replaced by a new action under the id since
	}
	if rec.State == journal.StateDone {
		return
	}
	// Not done: the write failed, or was never made.
	r.rec.mu.Lock()
	var tried, ended, other, far bool
	for _, w := range r.rec.writes {
		if w.proc != p || w.seq > c.endSeq {
			continue
		}
		if w.sync && w.err != nil {
			other = true
		}
		if !w.sync && w.rec.Key == key && w.rec.State == journal.StateDone {
			tried = true
			switch {
			case w.err == nil:
			case w.injected || !(errors.Is(w.err, context.Canceled) || errors.Is(w.err, context.DeadlineExceeded)):
				other = true
			case w.ctxEndedAtEntry && callersContext(w):
				ended = true
				far = far || w.call != nil && w.call.far
			default:
				other = true // cut by the journal timeout or OutcomeGrace, past a slow journal
			}
		}
	}
	r.rec.mu.Unlock()
	switch {
	case ended:
		r.violateTags("returned-is-recorded", tagIf(far, "far-deadline"), "%s (%s, key %s, %s) returned %d, and the journal keeps it %v: its done was written under a context that had already ended",
			c.name, id, key, cancelHow(c), st, rec.State)
	case !tried && !other:
		r.violate("returned-is-recorded", "%s (%s, key %s) returned %d, and the journal keeps it %v: no done was written",
			c.name, id, key, st, rec.State)
	}
}

// checkDoneIsFinal checks, before the history's processes close, that
// every key whose done was written is still done in the journal, where its
// record is still under that key. On the file journal a done written by a
// process that crashed may be lost with it (lazy updates): not checked.
func (r *runner) checkDoneIsFinal() {
	var p *process
	for _, q := range r.procs {
		if q != nil && !q.dead.Load() {
			p = q
			break
		}
	}
	if p == nil {
		return
	}
	type done struct {
		id  string
		key string
	}
	var ds []done
	seen := map[string]bool{}
	r.rec.mu.Lock()
	for _, w := range r.rec.writes {
		if w.sync || w.err != nil || w.rec.State != journal.StateDone || w.rec.Key == "" || seen[w.rec.Key] {
			continue
		}
		if r.h.jk == fileJournal && w.proc.diedSeq.Load() != 0 && w.proc != p {
			continue
		}
		seen[w.rec.Key] = true
		ds = append(ds, done{w.rec.ActionID, w.rec.Key})
	}
	r.rec.mu.Unlock()
	for _, d := range ds {
		rec, found, err := p.j.(journal.Getter).Get(context.Background(), d.id)
		if err != nil || !found || rec.Key != d.key || rec.State == journal.StateDone {
			continue
		}
		r.violate("done-is-final", "%s (key %s) was recorded done, and the journal now holds it %v", d.id, d.key, rec.State)
	}
}

// callersContext reports whether write w ran under its caller's own
// context, or one whose deadline is far in the past (a deadline 292 years
// ahead, overflowed), rather than a bound of its own that expired (an
// OutcomeGrace that ran out while a loaded machine did not run the write).
func callersContext(w writeEvent) bool {
	switch {
	case !w.hasDeadline:
		return true // a bound of the Transport's always has a deadline
	case w.left < -time.Hour:
		return true
	case w.call != nil && !w.call.deadline.IsZero():
		return !w.deadline.After(w.call.deadline.Add(5 * time.Millisecond))
	}
	return false
}

// keyOf is the key call c's requests went out under, or "".
func (r *runner) keyOf(c *call) string {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, ev := range r.rec.net {
		if ev.call == c && ev.key != "" {
			return ev.key
		}
	}
	return ""
}

func (r *runner) actionIDOf(i *intent) string {
	switch i.kind {
	case named:
		return i.action
	case keyed:
		return "key:" + i.key
	}
	return fingerprintID(r.net.url(), i.bodyBytes())
}

// checkDoneSurvives checks, after old crashed and now started on what it
// left, that every unnamed action old told done before it died is done in
// the journal: its done was synced before RoundTrip returned.
func (r *runner) checkDoneSurvives(old, now *process) {
	r.mu.Lock()
	var cs []*call
	for _, c := range r.calls {
		if c.proc == old && c.intent.kind == unnamed && !c.unchecked && c.endSeq != 0 && c.endSeq < old.diedSeq.Load() && c.err == nil {
			if _, ok := c.final(); ok && c.answer.key != "" {
				cs = append(cs, c)
			}
		}
	}
	r.mu.Unlock()
	for _, c := range cs {
		rec, found, err := now.j.(journal.Getter).Get(context.Background(), r.actionIDOf(c.intent))
		if err != nil || !found || rec.Key != c.answer.key || rec.State == journal.StateDone {
			continue
		}
		if r.writeFailed(old, c.answer.key) {
			continue
		}
		r.violate("done-survives-crash", "%s (unnamed, key %s) returned %d before %s crashed; after the crash the journal holds it %v",
			c.name, c.answer.key, c.status, old.name, rec.State)
	}
}

// writeFailed reports whether a done write of key by p failed, or the
// first Sync of p after it failed: the done may then be in memory only, as
// documented. A Sync never made is the Transport's to make (guarantee 2):
// no excuse.
func (r *runner) writeFailed(p *process, key string) bool {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	var doneAt int64
	for _, w := range r.rec.writes {
		if w.proc != p {
			continue
		}
		switch {
		case !w.sync && w.rec.Key == key && w.rec.State == journal.StateDone:
			if w.err != nil {
				return true
			}
			doneAt = w.seq
		case w.sync && doneAt != 0 && w.seq > doneAt:
			if w.err != nil {
				return true
			}
			return false
		}
	}
	return doneAt == 0
}

// checkHeldOpen checks that the answers the app read to EOF and kept open
// released their attempts (their contexts ended), as net/http releases a
// connection at EOF.
func (r *runner) checkHeldOpen() {
	if r.net.loop != nil {
		return
	}
	r.net.mu.Lock()
	bs := append([]*simBody(nil), r.net.bodies...)
	r.net.mu.Unlock()
	n, left := 0, 0
	var example string
	for _, b := range bs {
		if b.call == nil || !b.call.heldOpen || b.ctx == nil || b.call.unchecked || b.call.proc.dead.Load() {
			continue
		}
		b.mu.Lock()
		eof := b.off >= len(b.data) && b.cut < 0
		b.mu.Unlock()
		if !eof {
			continue
		}
		// Closed or not: the Transport closes the base's body at EOF
		// itself, and that is no release of the attempt; only its
		// context's end is.
		n++
		if b.ctx.Err() == nil {
			left++
			example = b.call.name
		}
	}
	if left > 0 {
		r.violateTags("released-at-eof", []string{"read-to-EOF"}, "%d of %d answers read to EOF and never closed still hold their attempt (e.g. %s): the attempt's context lives until the caller's ends",
			left, n, example)
	}
}

// check runs the checks that need the whole history.
func (r *runner) check() {
	r.rec.mu.Lock()
	net := append([]*netEvent(nil), r.rec.net...)
	events := append([]transportEvent(nil), r.rec.events...)
	reserves := append([]reserveEvent(nil), r.rec.reserves...)
	resolves := append([]resolveEvent(nil), r.rec.resolves...)
	r.rec.mu.Unlock()
	r.mu.Lock()
	intents := append([]*intent(nil), r.intents...)
	calls := append([]*call(nil), r.calls...)
	maxOffset, loose := r.maxOffset, r.looseAdvance
	r.mu.Unlock()
	charges := r.net.srv.Charges()

	// doneAt: when each key's action was first recorded done (its done
	// written, or, failing a record of that, its done event).
	doneAt := map[string]int64{}
	for _, e := range events {
		if e.ev.Kind == idemretry.EventDone && e.ev.Key != "" {
			if _, ok := doneAt[e.ev.Key]; !ok {
				doneAt[e.ev.Key] = e.seq
			}
		}
	}
	r.rec.mu.Lock()
	for _, w := range r.rec.writes {
		// A done write that failed counts too: the Transport holds the
		// outcome and writes it before the action is reserved again.
		if !w.sync && w.rec.State == journal.StateDone && w.rec.Key != "" {
			if d, ok := doneAt[w.rec.Key]; !ok || w.seq < d {
				doneAt[w.rec.Key] = w.seq
			}
		}
	}
	r.rec.mu.Unlock()
	minted := map[string]reserveEvent{}
	mints := map[string][]reserveEvent{} // every creation of a record with the key, in order
	for _, rv := range reserves {
		if rv.created && rv.err == nil {
			if _, ok := minted[rv.key]; !ok {
				minted[rv.key] = rv
			}
			mints[rv.key] = append(mints[rv.key], rv)
		}
	}
	held := map[string]int64{} // the first seq at which a Reserve returned the action's record
	seen := map[string]bool{}  // the keys a Reserve returned or a request carried
	for _, rv := range reserves {
		if rv.err == nil && rv.key != "" {
			seen[rv.key] = true
		}
	}
	for _, ev := range net {
		if ev.key != "" {
			seen[ev.key] = true
		}
	}
	for _, rv := range reserves {
		if rv.err == nil && rv.actionID != "" {
			if s, ok := held[rv.actionID]; !ok || rv.seq < s {
				held[rv.actionID] = rv.seq
			}
		}
	}
	for _, rv := range reserves {
		// A Reserve that failed may have stored the record it was asked
		// to create (the sync's wait cut short): its call minted the key.
		// Not when the action's record was already there: a Reserve
		// returns the existing record, and the key it was asked to create
		// with (an SDK's new one) is not stored.
		// Nor when nothing is seen of the key afterwards (no Reserve
		// returned it, no request carried it): then it was not stored, or
		// nothing of it can exist.
		if s, ok := held[rv.actionID]; ok && s < rv.seq || !seen[rv.wantKey] {
			continue
		}
		if rv.err != nil && rv.wantKey != "" && len(mints[rv.wantKey]) == 0 && rv.call != nil && rv.call.kind == callPay {
			rv.key = rv.wantKey
			mints[rv.key] = []reserveEvent{rv}
			minted[rv.key] = rv
		}
	}
	for _, rv := range reserves {
		if rv.err == nil && rv.key != "" && len(mints[rv.key]) == 0 && rv.call != nil && rv.call.kind == callPay {
			// Created where no call was seen creating it (a Reserve that
			// stored the record and then failed, or a record from before):
			// the first call to find it stands for its creator.
			mints[rv.key] = []reserveEvent{rv}
			minted[rv.key] = rv
		}
	}
	chargesOf := map[string][]paytest.Charge{}
	chargesUnder := map[string][]paytest.Charge{}
	byID := map[string]paytest.Charge{}
	for _, ch := range charges {
		chargesOf[ch.Intent] = append(chargesOf[ch.Intent], ch)
		chargesUnder[ch.Key] = append(chargesUnder[ch.Key], ch)
		byID[ch.ID] = ch
	}

	// charged-once and one-key-per-action: the keys of each intent, in the
	// order they were minted, and what may explain a second one.
	for _, i := range intents {
		var keys []reserveEvent
		for _, rv := range minted {
			if rv.call != nil && rv.call.intent == i {
				keys = append(keys, rv)
			}
		}
		sort.Slice(keys, func(a, b int) bool { return keys[a].seq < keys[b].seq })
		for k := 1; k < len(keys); k++ {
			prev, next := keys[k-1], keys[k]
			if r.secondKeyRight(i, prev, next, doneAt) {
				continue
			}
			if !r.mayHaveReached(net, prev.key) {
				continue // the first never left: nothing of it can exist
			}
			tags := append(append(tagIf(r.woken(next.call, net), "woken-joiner"), callTags(next.call)...), callTags(prev.call)...)
			tags = append(tags, r.causes([]paytest.Charge{{Key: prev.key}})...)
			r.violateTags("one-key-per-action", tags, "%s (%v %s): key %s minted by %s after key %s (minted by %s, %s), whose outcome may exist",
				i.name, i.kind, r.actionIDOf(i), next.key, next.call.name, prev.key, prev.call.name, r.stateOf(prev.key, doneAt))
		}
		cs := chargesOf[i.name]
		if len(cs) > 1 {
			// In the order their keys were minted, not the ledger's: a
			// held charge is numbered when it completes, after a later
			// key's.
			cs = append([]paytest.Charge(nil), cs...)
			sort.SliceStable(cs, func(a, b int) bool { return minted[cs[a].Key].seq < minted[cs[b].Key].seq })
			explained := true
			for k := 1; k < len(cs); k++ {
				a, b := minted[cs[k-1].Key], minted[cs[k].Key]
				if a.call == nil || b.call == nil || cs[k-1].Key == cs[k].Key || !r.secondKeyRight(i, a, b, doneAt) {
					explained = false
				}
			}
			if !explained {
				var ids []string
				for _, ch := range cs {
					ids = append(ids, ch.ID+" under "+ch.Key)
				}
				tags := r.causes(cs)
				for _, ch := range cs {
					if b := minted[ch.Key]; b.call != nil {
						if r.woken(b.call, net) {
							tags = append(tags, "woken-joiner")
						}
						tags = append(tags, callTags(b.call)...)
					}
				}
				r.violateTags("charged-once", tags, "%s (%v %s) was charged %d times: %s", i.name, i.kind, r.actionIDOf(i), len(cs), strings.Join(ids, ", "))
			}
		}
	}
	for key, cs := range chargesUnder {
		if key != "" && len(cs) > 1 {
			r.violateTags("no-send-after-window", tagIf(!validKey(key) && r.damaged.Load(), "damaged-record"), "key %s was charged %d times (%s, %s): the server had forgotten it, so it was sent after the server's key window",
				key, len(cs), cs[0].ID, cs[1].ID)
		}
	}

	// What the app was told.
	for _, c := range calls {
		if c.unchecked {
			continue
		}
		st, final := c.final()
		if !final || st < 200 || st >= 300 {
			continue
		}
		i := c.intent
		if c.answer.ok {
			ch, ok := byID[c.answer.charge]
			switch {
			case !ok:
				r.violate("told-paid-was-charged", "%s (%s, %s) was told %d with charge %s, which the server never made", c.name, i.name, r.actionIDOf(i), st, c.answer.charge)
			case c.answer.intent != i.name:
				owner := r.intentNamed(intents, c.answer.intent)
				if owner != nil && i.kind == unnamed && r.doneLost(ch.Key, c.startSeq) {
					continue // the first's done was lost with its process: documented (Transport.Close)
				}
				if i.kind == unnamed && r.heldElsewhere(ch.Key, c) {
					// README, key windows on the database's clock: an outcome
					// the database could not take is held by the machine that
					// got it, and another machine's identical unnamed payment
					// is taken for a tap of the first and given its replay.
					continue
				}
				if m, ok := minted[ch.Key]; ok && m.call != nil && m.call.intent.kind == unnamed && m.call.intent.finishedSeq != 0 &&
					m.call.joinSeq.Load() > m.call.intent.finishedSeq {
					// Its key is a new payment of a tap that came after
					// its intent had finished: an identical request while
					// it is in flight joins it (README guarantee 2).
					continue
				}
				if m, ok := minted[ch.Key]; ok && m.call != nil && m.call.intent.kind == unnamed && r.mintedAfterDone(m, doneAt) {
					// The same, seen as the Transport sees it: the tap's
					// reservation found its action recorded done (before
					// the model learnt its intent had finished) and so
					// minted a new payment, which c joined in flight.
					continue
				}
				if i.kind == unnamed && i.finishedSeq != 0 && c.joinSeq.Load() > i.finishedSeq {
					// A tap that came to its flight after another call
					// had finished its intent: an identical request while
					// another is in flight joins it (README guarantee 2).
					continue
				}
				tags := r.causes([]paytest.Charge{ch})
				if r.woken(c, net) || r.woken(minted[ch.Key].call, net) {
					tags = append(tags, "woken-joiner")
				}
				if who := r.finishedFlight(c, ch.Key, net); who != "" {
					tags = append(tags, "joined-finished-flight")
					v := fmt.Sprintf("; it joined %s, a request of the finished %s in the air", who, c.answer.intent)
					c.note = v
				}
				tags = append(tags, callTags(c)...)
				r.violateTags("not-another-intents-replay", tags, "%s (%s, %v %s%s) was answered %d with %s's charge %s under key %s (replayed %v)%s",
					c.name, i.name, i.kind, r.actionIDOf(i), repeatNote(i), st, c.answer.intent, c.answer.charge, c.answer.key, c.replay, c.note)
			}
			continue
		}
		if len(chargesOf[i.name]) == 0 {
			if c.resumeKey != "" && len(chargesUnder[c.resumeKey]) > 0 {
				continue // its key was charged, by a request that reused it (see lostDone)
			}
			if i.kind == unnamed && (r.lostDone(i, c.startSeq) || r.lateFlightOverlaps(c, minted) || r.doneHeldElsewhere(i, c)) {
				continue
			}
			tags := callTags(c)
			late := false
			if i.kind == unnamed {
				// Its answer (unread) may be under a key another intent's
				// late tap minted (a new payment by the README's rule,
				// joined while pending), or a woken joiner's (new-1).
				for _, m := range minted {
					mc := m.call
					if mc == nil || mc.intent == i || mc.intent.kind != unnamed || mc.intent.body != i.body || m.seq > c.endSeq {
						continue
					}
					if r.woken(mc, net) {
						tags = append(tags, "woken-joiner")
					} else if mc.intent.finishedSeq != 0 && mc.joinSeq.Load() > mc.intent.finishedSeq {
						late = true
					}
					// A key whose done was lost to a known bug (a deadline 292
					// years ahead) stays pending, and answers this call.
					tags = append(tags, r.causes([]paytest.Charge{{Key: m.key}})...)
				}
			}
			if late && len(tags) == 0 {
				continue
			}
			r.violateTags("told-paid-was-charged", tags, "%s (%s, %s) was told %d, and the server never charged %s", c.name, i.name, r.actionIDOf(i), st, i.name)
		}
	}

	// The network's view.
	// A key's form is the one it was first sent in since its record was
	// last created: a record forgotten (Resolve found it not charged, or
	// its window ended) and created again starts afresh.
	formOf, formBy := map[keyGenT]bool{}, map[keyGenT]string{}
	createdAt := map[string][]int64{}
	for _, rv := range reserves {
		if rv.created && rv.err == nil && rv.key != "" {
			createdAt[rv.key] = append(createdAt[rv.key], rv.seq)
		}
	}
	genOf := func(key string, seq int64) keyGenT {
		n := 0
		for _, s := range createdAt[key] {
			if s < seq {
				n++
			}
		}
		return keyGenT{key, n}
	}
	type actionKey struct {
		i   *intent
		key string
	}
	keysOf := map[actionKey]bool{}
	for _, rv := range reserves {
		if rv.call != nil && rv.key != "" && (rv.err == nil || rv.wantKey == rv.key) {
			keysOf[actionKey{rv.call.intent, rv.key}] = true
		}
		if rv.call != nil && rv.wantKey != "" && rv.err != nil {
			keysOf[actionKey{rv.call.intent, rv.wantKey}] = true // it may have been stored
		}
	}
	bodyOf := map[string][32]byte{}
	firstCall := map[string]string{}
	type pk struct {
		p   *process
		key string
	}
	open := map[pk][]*netEvent{}
	for _, ev := range net {
		if ev.call != nil && ev.bodyHash != sum(ev.call.intent.bodyBytes()) {
			r.violateTags("request-body-intact", tagIf(ev.proc.opts.maxBuffered == math.MaxInt64, "max-buffered=MaxInt64"), "%s attempt %d: the server got %d bytes, not the %d of %s's body", ev.call.name, ev.attempt, ev.bodyLen,
				len(ev.call.intent.bodyBytes()), ev.call.intent.name)
		}
		_, damagedID := r.damagedID.Load(actionIDOfEvent(r, ev))
		damagedID = damagedID || r.callDamaged(ev.call, reserves)
		if len(ev.keys) != 1 {
			r.violateTags("valid-key", tagIf(damagedID, "damaged-record"), "%s attempt %d went out with %d Idempotency-Key headers %q", callName(ev.call), ev.attempt, len(ev.keys), ev.keys)
			continue
		}
		if !validKey(ev.key) {
			r.violateTags("valid-key", tagIf(damagedID, "damaged-record"), "%s attempt %d went out with the key %q", callName(ev.call), ev.attempt, ev.keyRaw)
			continue
		}
		quoted := strings.HasPrefix(ev.keyRaw, `"`)
		kg := genOf(ev.key, ev.seq)
		if f, ok := formOf[kg]; !ok {
			formOf[kg], formBy[kg] = quoted, fmt.Sprintf("%s attempt %d", callName(ev.call), ev.attempt)
			if want, why, ok := r.firstForm(kg, mints[kg.key]); ok && want != quoted {
				r.violateTags("key-form", tagIf(damagedID, "damaged-record"), "%s attempt %d, the first request under key %s, went out quoted %v; %s",
					callName(ev.call), ev.attempt, ev.key, quoted, why)
			}
		} else if f != quoted {
			r.violateTags("key-form", tagIf(damagedID, "damaged-record"), "%s attempt %d went out with the key %s quoted %v, and %s sent it quoted %v: a key keeps the form it was first sent in",
				callName(ev.call), ev.attempt, ev.key, quoted, formBy[kg], f)
		}
		if ev.call != nil && ev.call.intent.kind == named && !keysOf[actionKey{ev.call.intent, ev.key}] {
			r.violateTags("journaled-key", tagIf(damagedID, "damaged-record"), "%s attempt %d (%s, %s%s) went out under key %s, which no reservation of its action returned",
				callName(ev.call), ev.attempt, ev.call.intent.name, ev.call.intent.action, sdkNote(ev.call), ev.key)
		}
		if h, ok := bodyOf[ev.key]; ok && h != ev.bodyHash {
			r.violate("one-body-per-key", "key %s went out with two bodies: first by %s, then by %s", ev.key, firstCall[ev.key], callName(ev.call))
		} else if !ok {
			bodyOf[ev.key], firstCall[ev.key] = ev.bodyHash, callName(ev.call)
		}
		k := pk{ev.proc, ev.key}
		for _, o := range open[k] {
			if o.endSeq == 0 || o.endSeq > ev.seq {
				r.violate("one-flight", "%s's %s and %s's %s: two requests of key %s in the air at once in %s",
					callName(o.call), ordinal(o.attempt), callName(ev.call), ordinal(ev.attempt), ev.key, ev.proc.name)
				break
			}
		}
		open[k] = append(open[k], ev)
		var rv reserveEvent
		var ok bool
		for _, m := range mints[ev.key] {
			if m.seq < ev.seq {
				rv, ok = m, true
			}
		}
		if ok {
			window := ev.proc.opts.keyWindow
			tolerance := 2*maxOffset + loose + time.Second
			if age := ev.trueAt - rv.trueAt; age >= window+tolerance {
				r.violate("no-send-after-window", "%s attempt %d sent key %s %v after it was minted, past its key window %v", callName(ev.call), ev.attempt,
					ev.key, age, window)
			}
		}
	}
	byCall := map[*call][]*netEvent{}
	for _, ev := range net {
		if ev.call != nil {
			byCall[ev.call] = append(byCall[ev.call], ev)
		}
	}
	for c, evs := range byCall {
		sort.Slice(evs, func(a, b int) bool { return evs[a].attempt < evs[b].attempt })
		if cs := c.cancelSeq.Load(); cs != 0 {
			after := 0
			for _, ev := range evs {
				if ev.seq > cs {
					after++
				}
			}
			// One request may leave as the cancel comes (the Transport's
			// last look before sending came first); none after a cancel
			// made before an attempt's answer was returned.
			in, later := c.cancelIn.Load(), 0
			for _, ev := range evs {
				if in != 0 && ev.attempt > int(in) {
					later++
				}
			}
			switch {
			case after > 1:
				r.violateTags("no-retry-after-cancel", tagIf(c.reqCancel != nil, "Request.Cancel"), "%s (%s) made %d requests after its caller cancelled it", c.name, cancelHow(c), after)
			case later > 0:
				r.violateTags("no-retry-after-cancel", tagIf(c.reqCancel != nil, "Request.Cancel"), "%s (%s) made %d requests after its caller cancelled it as attempt %d's answer came",
					c.name, cancelHow(c), later, in)
			}
		}
		for k := 1; k < len(evs); k++ {
			a, b := evs[k-1], evs[k]
			if a.ra <= 0 {
				continue
			}
			floor := min(a.ra, 100*365*24*time.Hour)
			if b.trueAt-a.trueAt < floor-time.Millisecond {
				r.violateTags("retry-after-floor", tagIf(a.proc.opts.maxRetryAfter == math.MaxInt64, "max-retry-after=MaxInt64"), "%s: attempt %d was answered with Retry-After %v, and attempt %d went out %v later",
					c.name, a.attempt, a.ra, b.attempt, b.trueAt-a.trueAt)
			}
		}
	}

	// No hopeless wait: a retry scheduled (EventRetry) with a wait longer
	// than its caller's deadline leaves is never followed by another
	// attempt of that call.
	for _, e := range events {
		if e.ev.Kind != idemretry.EventRetry || e.ev.Key == "" {
			continue
		}
		var c *call
		for _, ev := range net {
			if ev.seq < e.seq && ev.key == e.ev.Key && ev.proc == e.proc && ev.call != nil {
				c = ev.call
			}
		}
		if c == nil || c.deadline.IsZero() || e.ev.Wait <= c.deadline.Sub(e.realAt)+20*time.Millisecond {
			continue
		}
		for _, ev := range byCall[c] {
			if ev.seq > e.seq {
				r.violate("no-hopeless-wait", "%s (deadline %v) scheduled a wait of %v with %v left to its deadline, and sent attempt %d after it",
					c.name, c.deadline.Sub(c.start).Round(time.Millisecond), e.ev.Wait, c.deadline.Sub(e.realAt).Round(time.Millisecond), ev.attempt)
				break
			}
		}
	}

	// Bounds, sharing, answers.
	for _, c := range calls {
		if c.unchecked || c.end.IsZero() || c.kind == callResume {
			continue
		}
		r.checkBound(c, byCall)
		r.checkShared(c, net)
		st, final := c.final()
		if final && st >= 200 && st < 300 && c.err == nil && c.readMode == readAll && c.readErr == nil && !c.answer.ok &&
			!r.answerCut(net, c, st) {
			r.violateTags("answer-intact", tagIf(c.proc.opts.maxShared == math.MaxInt64, "max-shared=MaxInt64"), "%s (%s) was told %d with a body of %d bytes that is no charge's answer (%q), though the network delivered it whole",
				c.name, c.intent.name, st, len(c.respBody), truncate(c.respBody))
		}
	}
	for _, rs := range resolves {
		until, ok := addSat(rs.rec.CreatedAt, rs.window, rs.settle)
		if !ok || rs.earlier.Before(until) {
			r.violateTags("resolve-after-settle", tagIf(rs.settle == math.MaxInt64, "settle=MaxInt64"), "Resolve of %s (key %s) at %v, before its key window %v and settle time %s had passed since %v",
				rs.rec.ActionID, rs.rec.Key, rs.earlier.Format(time.RFC3339), rs.window, durString(rs.settle), rs.rec.CreatedAt.Format(time.RFC3339))
		}
		if rs.inAir > 0 {
			r.violate("resolve-after-settle", "Resolve of %s (key %s) while %d request(s) of it were in the air", rs.rec.ActionID, rs.rec.Key, rs.inAir)
		}
	}
	for _, c := range calls {
		if !c.unchecked && c.hasOutcome && c.endSeq != 0 && !c.proc.dead.Load() {
			r.checkOutcome(c, net, byID)
		}
	}
	r.net.mu.Lock()
	bs := append([]*simBody(nil), r.net.bodies...)
	r.net.mu.Unlock()
	for _, b := range bs {
		if !b.wasClosed() {
			r.violate("bodies-closed", "a response body of %s was never closed", callName(b.call))
			break
		}
	}
}

// callDamaged reports whether the journal layer damaged a record call c
// reserved (under whatever id the Transport gave its action).
func (r *runner) callDamaged(c *call, reserves []reserveEvent) bool {
	if c == nil {
		return false
	}
	for _, rv := range reserves {
		if rv.call == c {
			if _, ok := r.damagedID.Load(rv.actionID); ok {
				return true
			}
		}
	}
	return false
}

// actionIDOfEvent is the action id of ev's call, or "".
func actionIDOfEvent(r *runner, ev *netEvent) string {
	if ev.call == nil {
		return ""
	}
	return r.actionIDOf(ev.call.intent)
}

// callTags tags what in call c's own settings may explain a violation it
// is in: a body without GetBody under WithMaxBufferedBody(math.MaxInt64).
func callTags(c *call) []string {
	var tags []string
	if c != nil && !c.getBody && c.kind == callPay && c.proc.opts.maxBuffered == math.MaxInt64 {
		tags = append(tags, "max-buffered=MaxInt64")
	}
	if c != nil && c.proc.opts.maxShared == math.MaxInt64 && !c.answer.ok {
		tags = append(tags, "max-shared=MaxInt64") // its answer may have been emptied: it cannot say whose it is
	}
	return tags
}

func tagIf(cond bool, tag string) []string {
	if cond {
		return []string{tag}
	}
	return nil
}

// causes tags what may explain a wrong charge or answer under the keys of
// charges: a damaged record's key, bodies a "no limit" buffer emptied, a
// done written under an ended context (a deadline 292 years ahead).
func (r *runner) causes(charges []paytest.Charge) []string {
	var tags []string
	add := func(t string) {
		for _, x := range tags {
			if x == t {
				return
			}
		}
		tags = append(tags, t)
	}
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, ch := range charges {
		if !validKey(ch.Key) && r.damaged.Load() {
			add("damaged-record")
		}
		for _, ev := range r.rec.net {
			if ev.key == ch.Key && ev.call != nil && ev.bodyHash != sum(ev.call.intent.bodyBytes()) && ev.proc.opts.maxBuffered == math.MaxInt64 {
				add("max-buffered=MaxInt64")
			}
		}
		for _, w := range r.rec.writes {
			if !w.sync && w.rec.Key == ch.Key && w.rec.State == journal.StateDone && w.ctxEndedAtEntry && w.call != nil && w.call.far {
				add("far-deadline")
			}
		}
	}
	return tags
}

func (r *runner) intentNamed(is []*intent, name string) *intent {
	for _, i := range is {
		if i.name == name {
			return i
		}
	}
	return nil
}

// woken reports whether call c waited in a flight whose leader stopped
// for its own reasons, and so was woken to carry the action on: another
// call of the same action in its process ended with its context's error, a
// deadline's give-up, or Resume's ErrNotResumable, after c chose its
// flight and before c sent anything or ended.
func (r *runner) woken(c *call, net []*netEvent) bool {
	if c == nil {
		return false
	}
	j := c.joinSeq.Load()
	if j == 0 {
		return false
	}
	first := c.endSeq
	for _, ev := range net {
		if ev.call == c && ev.seq < first {
			first = ev.seq
		}
	}
	id := r.actionIDOf(c.intent)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.calls {
		if d == c || d.proc != c.proc || d.endSeq <= j || d.endSeq >= first || r.actionIDOf(d.intent) != id {
			continue
		}
		if cutShortEnd(d) || errors.Is(d.err, idemretry.ErrNotResumable) {
			return true
		}
	}
	return false
}

// cutShortEnd reports whether call d ended for its own context: its
// cancel or deadline, or a wait its deadline would have cut.
func cutShortEnd(d *call) bool {
	for _, err := range []error{d.err, d.giveUp} {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, idemretry.ErrWaitExceedsDeadline) {
			return true
		}
	}
	return false
}

// finishedFlight names the call, if any, whose request under key was in
// the air when c chose its flight, and whose intent had finished by then:
// c, a new payment, joined the resend of an action already done (Resume's
// resend of a finished payment, or a tap within the duplicate window).
func (r *runner) finishedFlight(c *call, key string, net []*netEvent) string {
	j := c.joinSeq.Load()
	for _, ev := range net {
		d := ev.call
		if d == nil || d == c || ev.key != key || d.intent == c.intent || d.proc != c.proc {
			continue
		}
		fin := d.intent.finishedSeq
		if fin != 0 && fin < j && d.startSeq < j && (d.endSeq == 0 || d.endSeq > j) {
			kind := "a send"
			if d.kind == callResume {
				kind = "Resume's resend"
			}
			return fmt.Sprintf("%s (%s)", d.name, kind)
		}
	}
	return ""
}

// lateFlightOverlaps reports whether unnamed call c was in the air with the
// flight of a late tap: a call of another intent with c's body that chose
// its flight after its own intent had finished, and minted a new key (a
// new payment, by the README's rule), which c may have joined.
func (r *runner) lateFlightOverlaps(c *call, minted map[string]reserveEvent) bool {
	j := c.joinSeq.Load()
	for _, m := range minted {
		mc := m.call
		if mc == nil || mc.intent == c.intent || mc.intent.kind != unnamed || mc.intent.body != c.intent.body {
			continue
		}
		late := mc.intent.finishedSeq != 0 && mc.joinSeq.Load() > mc.intent.finishedSeq
		if late && m.seq < c.endSeq && (mc.endSeq == 0 || mc.endSeq > j) {
			return true
		}
	}
	return false
}

// lostDone reports whether an unnamed intent with i's body had its done
// lost with a process that ended before seq: its pending key then answers
// a new payment with its replay, as documented (Transport.Close).
func (r *runner) lostDone(i *intent, seq int64) bool {
	lost := false
	r.mintOf.Range(func(k, v any) bool {
		c := v.(*call)
		if c.intent != i && c.intent.kind == unnamed && c.intent.body == i.body && r.doneLost(k.(string), seq) {
			lost = true
			return false
		}
		return true
	})
	return lost
}

// doneHeldElsewhere reports whether c, a call of unnamed intent i, may
// have been answered under the key of another unnamed intent with i's body
// whose done another machine's process could not write (a failed Update
// before c started, none landed since): the shared journal still says that
// action is pending, so the Transport here sends c as a tap of it, under
// its key, and the server replays (README, "Guarantees": what the journal
// does not record, another machine cannot know).
func (r *runner) doneHeldElsewhere(i *intent, c *call) bool {
	held := false
	r.mintOf.Range(func(k, v any) bool {
		m := v.(*call)
		if m.intent == i || m.intent.kind != unnamed || m.intent.body != i.body {
			return true
		}
		key := k.(string)
		r.rec.mu.Lock()
		failed, landed := false, false
		for _, w := range r.rec.writes {
			if w.seq >= c.startSeq || w.rec.Key != key || w.rec.State != journal.StateDone || w.proc == nil {
				continue
			}
			switch {
			case w.err == nil:
				landed = true
			case w.proc.machine != c.proc.machine:
				failed = true
			}
		}
		r.rec.mu.Unlock()
		if failed && !landed {
			held = true
			return false
		}
		return true
	})
	return held
}

// doneLost reports whether the done of key may have been lost with its
// process before seq: no write of it landed (a failed Update, or, on the
// file journal, an Update with no Sync after it), and the process that
// held it ended (a crash, or a restart whose Close could not write it)
// before seq.
func (r *runner) doneLost(key string, seq int64) bool {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	var failedBy []*process
	for _, w := range r.rec.writes {
		if w.seq >= seq || w.sync || w.rec.Key != key || w.rec.State != journal.StateDone {
			continue
		}
		if w.err == nil {
			if r.h.jk != fileJournal {
				return false
			}
			for _, s := range r.rec.writes {
				if s.sync && s.proc == w.proc && s.seq > w.seq && s.seq < seq && s.err == nil {
					return false
				}
			}
		}
		failedBy = append(failedBy, w.proc)
	}
	for _, p := range failedBy {
		if d := p.diedSeq.Load(); d != 0 && d < seq {
			return true
		}
	}
	return false
}

// secondKeyRight reports whether intent i may have next's key after
// prev's: prev was forgotten after Resolve found it not charged; or i is
// unnamed and the call that minted next chose its flight after prev's
// action was recorded done (then it is a new payment by the README's rule).
func (r *runner) secondKeyRight(i *intent, prev, next reserveEvent, doneAt map[string]int64) bool {
	r.mu.Lock()
	forgotten := i.forgottenKeys[prev.key]
	r.mu.Unlock()
	if forgotten {
		return true
	}
	if at, ok := r.forgotAt.Load(prev.key); ok && next.call != nil && next.call.joinSeq.Load() > at.(int64) {
		// Reconciled and forgotten before this call reached its flight:
		// "The next request for the action gets a new key" (Journal.Forget).
		return true
	}
	if i.kind != unnamed || next.call == nil || next.call.withinWindow {
		return false
	}
	d, ok := doneAt[prev.key]
	if ok && r.doneElsewhere(prev.key, next.call.proc, next.seq) {
		// Done by another machine: nothing of it was in the air in this
		// Transport, and the journal said done when this one reserved.
		return true
	}
	j := next.call.joinSeq.Load()
	if next.call.reqCancel != nil {
		// A request with a Cancel channel boards under a context the
		// Transport derives first (roundTripCancel), so its choice of a
		// flight is not seen (its mark is RoundTrip's start). Its own
		// Reserve finding the first key's record after the done tells
		// that it led a flight of its own after the first one landed;
		// so does its Reserve finding a later key of the action, one
		// created after that done (a new payment in between).
		j = r.foundAfter(next.call, prev.key, d)
	}
	return ok && j != 0 && j > d
}

// foundAfter returns the seq of c's first Reserve that returned key's
// record, or the record of a key another call created after seq done, or
// 0.
func (r *runner) foundAfter(c *call, key string, done int64) int64 {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	created := map[string]int64{} // each key's first creation by another call
	for _, rv := range r.rec.reserves {
		if rv.err == nil && rv.created && rv.call != c {
			if _, ok := created[rv.key]; !ok {
				created[rv.key] = rv.seq
			}
		}
		if rv.call == c && rv.err == nil && (rv.key == key || done != 0 && created[rv.key] > done) {
			return rv.seq
		}
	}
	return 0
}

// mintedAfterDone reports whether the call that minted m's key did so
// after its Reserve had found another key's record of the action, recorded
// done by then: for an unnamed action, a new payment (README, "one after
// the first finished is a new action").
func (r *runner) mintedAfterDone(m reserveEvent, doneAt map[string]int64) bool {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, rv := range r.rec.reserves {
		if rv.call != m.call || rv.err != nil || rv.created || rv.key == m.key || rv.seq > m.seq {
			continue
		}
		if d, ok := doneAt[rv.key]; ok && d < rv.seq {
			return true
		}
	}
	return false
}

// heldElsewhere reports whether key's done failed to reach the journal on
// another machine than c's before c began, and landed nowhere before then.
func (r *runner) heldElsewhere(key string, c *call) bool {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	failed := false
	for _, w := range r.rec.writes {
		if w.sync || w.rec.Key != key || w.rec.State != journal.StateDone || w.seq > c.endSeq {
			continue
		}
		if w.err == nil && w.seq < c.startSeq {
			return false
		}
		if w.err != nil && w.proc.machine != c.proc.machine {
			failed = true
		}
	}
	return failed
}

// doneElsewhere reports whether key's done was written by a process other
// than p: another machine on the same table, or an earlier process of p's
// machine (crashed or closed), whose done landed before seq, p's Reserve
// that minted the next key. Nothing of it was in the air in p's Transport,
// and the journal said done when p reserved: an unnamed request then is a
// new payment (package doc, "Actions and keys"), as it would be after any
// restart that follows a recorded done the app never saw.
func (r *runner) doneElsewhere(key string, p *process, seq int64) bool {
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, w := range r.rec.writes {
		if w.sync || w.rec.Key != key || w.rec.State != journal.StateDone || w.proc == p {
			continue
		}
		if w.proc.machine != p.machine || w.err == nil && w.seq < seq {
			return true
		}
	}
	return false
}

// mayHaveReached reports whether a request under key may have reached the
// server: one was written (any that was not refused at the dial).
func (r *runner) mayHaveReached(net []*netEvent, key string) bool {
	for _, ev := range net {
		if ev.key == key && ev.fault.kind != fRefuse {
			return true
		}
	}
	return false
}

func (r *runner) stateOf(key string, doneAt map[string]int64) string {
	if _, ok := doneAt[key]; ok {
		return "recorded done"
	}
	return "not recorded done"
}

// checkBound holds call c to its documented bound.
func (r *runner) checkBound(c *call, byCall map[*call][]*netEvent) {
	// Slack for a loaded machine (under -race, beside other builds): a
	// goroutine can wait that long for a core.
	slack := time.Second
	lease := time.Duration(0)
	if r.h.jk == sqlJournal {
		lease = time.Second
	}
	var limit time.Time
	var what string
	switch {
	case !c.deadline.IsZero():
		limit, what = c.deadline.Add(idemretry.OutcomeGrace+lease+slack), "its deadline"
	case c.cancelAt.Load() != 0:
		limit, what = time.Unix(0, c.cancelAt.Load()).Add(idemretry.OutcomeGrace+lease+slack), "its cancel"
	default:
		// No bound of the caller's: the Transport's own limits (drains,
		// the share time, journal timeouts), loosely.
		n := len(byCall[c])
		limit, what = c.start.Add(20*time.Second+time.Duration(n)*1500*time.Millisecond), "the Transport's own limits"
	}
	if c.end.After(limit) {
		var tags []string
		key := c.answer.key
		var ae *idemretry.ActionError
		if key == "" && errors.As(c.err, &ae) {
			key = ae.Key
		}
		if key == "" {
			key = r.keyOf(c)
		}
		r.rec.mu.Lock()
		for _, ev := range r.rec.net {
			if (ev.key == key || ev.call != nil && ev.call.intent == c.intent) && ev.fault.kind == fUpgrade {
				tags = []string{"101-upgrade"}
				break
			}
		}
		r.rec.mu.Unlock()
		if c.reqCancel != nil {
			tags = append(tags, "Request.Cancel")
		}
		r.violateTags("bounded", tags, "%s (%s, %s) returned %v after %s", c.name, c.intent.name, cancelHow(c), c.end.Sub(limit)+slack, what)
	}
}

// judgedStatus reports whether the Transport reads the start of an answer
// of status to judge it, whatever the RetryPolicy (attempt.go's
// mayReadBody).
func judgedStatus(status int) bool {
	return status == http.StatusBadRequest || status == http.StatusConflict || status == http.StatusUnprocessableEntity
}

// checkShared holds a caller that got ErrResponseNotShared to
// Transport.RoundTrip's rule: only a body over the sharing limit, or one
// still arriving after DefaultMaxShareTime, is not shared.
func (r *runner) checkShared(c *call, net []*netEvent) {
	var ae *idemretry.ActionError
	if !errors.As(c.err, &ae) || !errors.Is(c.err, idemretry.ErrResponseNotShared) {
		return
	}
	limit := c.proc.opts.maxShared
	if limit == 0 {
		limit = idemretry.DefaultMaxSharedResponse
	}
	for _, ev := range net {
		if ev.key != ae.Key || ev.proc != c.proc || ev.status != ae.Status || ev.seq > c.endSeq {
			continue
		}
		// A body cut on the wire is not shareable; one that stalls for
		// less than DefaultMaxShareTime (every stall here) arrives whole,
		// but for a 400, 409 or 422, whose body the RetryPolicy is given
		// to judge for at most DefaultMaxDrainTime (attempt.go's
		// classify): one that stalls that long is cut there.
		if ev.fault.kind == fReset || ev.fault.kind == fUpgrade || int64(len(paytestBody(ev))) > limit || limit < 1024 ||
			ev.fault.kind == fStall && ev.fault.d >= idemretry.DefaultMaxDrainTime && judgedStatus(ev.status) {
			return
		}
	}
	if ae.Status == 0 {
		return
	}
	if !c.deadline.IsZero() && c.end.After(c.deadline.Add(-10*time.Millisecond)) {
		return // its own deadline came
	}
	leaders := errors.Is(ae.Err, context.Canceled) || errors.Is(ae.Err, context.DeadlineExceeded) ||
		ae.Err != nil && strings.Contains(ae.Err.Error(), "request canceled") // the leader's Request.Cancel
	r.violateTags("shared-answer", tagIf(leaders, "leader-context"), "%s (%s, %s) joined a flight and got ErrResponseNotShared (status %d, %v) %v after it began, for an answer that fit the limit and arrived whole",
		c.name, c.intent.name, ae.Action, ae.Status, ae.Err, c.end.Sub(c.start).Round(time.Millisecond))
}

// paytestBody estimates the size of ev's answer: every answer of the
// simulation is under 200 bytes.
func paytestBody(ev *netEvent) []byte { return make([]byte, 200) }

// answerCut reports whether the network cut the body of an answer c may
// have been given: a request of its key answered with st and reset.
func (r *runner) answerCut(net []*netEvent, c *call, st int) bool {
	for _, ev := range net {
		if ev.proc == c.proc && ev.status == st && ev.damaged && (ev.key == c.answer.key || c.answer.key == "") && ev.seq < c.endSeq {
			return true
		}
	}
	return false
}

func addSat(t time.Time, a, b time.Duration) (time.Time, bool) {
	if a > math.MaxInt64-b {
		return time.Time{}, false
	}
	return t.Add(a + b), true
}

func validKey(k string) bool {
	if k == "" || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' || k[i] == '"' || k[i] == '\\' {
			return false
		}
	}
	return true
}

func sdkNote(c *call) string {
	if c.wroteKey != "" {
		return fmt.Sprintf(", carrying its own key %s", c.wroteKey)
	}
	return ""
}

// keyGenT is a key and how many times its record had been created by the
// time a request went out under it.
type keyGenT struct {
	key string
	gen int
}

// firstForm is the form kg's first request must go out in, from the
// record that created it (ms, the key's creations in order): its KeyForm
// (a minted key's is WithQuotedKey's when it was minted; an adopted one's
// as the caller wrote it), checked against the minting process's option
// and the creating call's own key.
func (r *runner) firstForm(kg keyGenT, ms []reserveEvent) (quoted bool, why string, ok bool) {
	if len(ms) == 0 {
		return false, "", false
	}
	m := ms[0]
	if kg.gen >= 1 && kg.gen <= len(ms) {
		m = ms[kg.gen-1] // the creation its requests follow
	}
	if m.call == nil || m.err != nil || !m.created {
		return false, "", false
	}
	switch {
	case m.call.wroteKey == kg.key:
		return m.call.keyQuoted, fmt.Sprintf("%s, whose reservation created its record, wrote it quoted %v", m.call.name, m.call.keyQuoted), true
	case m.call.wroteKey == "" || m.call.intent.kind == named:
		return m.proc.opts.quoted, fmt.Sprintf("it was minted by %s (%s) with WithQuotedKey %v", m.call.name, m.proc.name, m.proc.opts.quoted), true
	}
	return false, "", false
}

func callName(c *call) string {
	if c == nil {
		return "a request of no call"
	}
	return c.name
}

func ordinal(n int) string { return fmt.Sprintf("attempt %d", n) }

func cancelHow(c *call) string {
	switch {
	case !c.deadline.IsZero():
		return fmt.Sprintf("deadline %v", c.deadline.Sub(c.start).Round(time.Millisecond))
	case c.reqCancel != nil:
		return "Request.Cancel"
	case c.far:
		return "deadline 292 years ahead"
	case c.cancelSeq.Load() != 0:
		return "cancelled"
	}
	return "no deadline"
}

func repeatNote(i *intent) string {
	if i.repeatOf != nil {
		return ", a deliberate repeat of " + i.repeatOf.name
	}
	return ""
}

func truncate(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "..."
	}
	return string(b)
}

var _ = http.StatusOK

// checkOutcome holds what OutcomeOf said of call c (or its ResumeResult's
// Outcome) to what the network and the ledger saw.
func (r *runner) checkOutcome(c *call, net []*netEvent, byID map[string]paytest.Charge) {
	o := c.outcome
	reached := func() string {
		for _, ev := range net {
			if ev.seq >= c.endSeq || !ev.delivered {
				continue
			}
			if o.Key != "" && ev.key == o.Key || o.Key == "" && ev.call == c {
				return fmt.Sprintf("%s attempt %d (%s)", callName(ev.call), ev.attempt, ev.outcome)
			}
		}
		return ""
	}
	what := fmt.Sprintf("%s (%s, %s, %s)", c.name, c.intent.name, r.actionIDOf(c.intent), cancelHow(c))
	if c.kind == callResume {
		what += ", Resume"
	}
	switch o.Kind {
	case idemretry.NotSent, idemretry.Pending, idemretry.Refused:
		if o.Kind == idemretry.NotSent && o.MaybeProcessed {
			r.violate("outcome-of", "%s: OutcomeOf says NotSent with MaybeProcessed true", what)
		}
		if o.MaybeProcessed {
			break
		}
		if by := reached(); by != "" {
			r.violate("outcome-of", "%s: OutcomeOf says %v (key %q, MaybeProcessed false, reason %v), and %s had reached the server under it before the call returned",
				what, o.Kind, o.Key, o.Reason, by)
		}
	case idemretry.Done:
		if st, final := c.final(); c.kind == callPay && (!final || st != o.Status) {
			r.violate("outcome-of", "%s: OutcomeOf says Done with status %d, and the call returned status %d, err %v, give-up %v", what, o.Status, c.status, c.err, c.giveUp)
		}
		if c.answer.ok && c.answer.key != o.Key {
			r.violate("outcome-of", "%s: OutcomeOf says Done under key %s, and the answer is the server's for key %s (charge %s)", what, o.Key, c.answer.key, c.answer.charge)
		}
	}
	if o.Key != "" && c.kind == callPay {
		for _, ev := range net {
			if ev.call == c && ev.key != "" && ev.key != o.Key {
				r.violate("outcome-of", "%s: OutcomeOf names key %s, and its attempt %d went out under %s", what, o.Key, ev.attempt, ev.key)
				break
			}
		}
	}
	if c.kind == callResume && c.status >= 200 && c.status < 300 && !c.resumeTrunc {
		a, ok := paytestAnswer(c.resumeBody)
		switch {
		case !ok && !r.answerCut(net, c, c.status):
			r.violate("resume-body", "%s (key %s): ResumeResult %d with a Body of %d bytes that is no charge's answer (%q), not truncated",
				what, c.resumeKey, c.status, len(c.resumeBody), truncate(c.resumeBody))
		case ok && (a.key != c.resumeKey || byID[a.charge].Key != c.resumeKey):
			r.violate("resume-body", "%s: ResumeResult for key %s answered charge %s under key %s, which the ledger has under %q",
				what, c.resumeKey, a.charge, a.key, byID[a.charge].Key)
		}
	}
}
