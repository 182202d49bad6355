// Package idemretry makes "send it again" safe for payment-style HTTP
// requests.
//
// A customer taps "Pay" twice. A phone loses signal after the server charged
// the card but before the answer came back. An app is killed mid-request. In
// each case the client must send the request again, and the server must
// perform it once. idemretry is the client half of the Idempotency-Key
// protocol, as an [http.RoundTripper]: every logical action gets one UUIDv4
// key, written durably to a journal before the first attempt leaves the
// process, and every retry carries the same key, in another goroutine or
// after a restart.
//
// Use it as an *http.Client ([NewClient]) or as the Transport of a client
// you already have ([NewTransport]), and branch on [OutcomeOf]:
//
//	client, err := idemretry.NewClient(idemretry.WithRequireAction())
//	if err != nil { ... }
//	defer client.Close()
//	ctx = idemretry.WithAction(ctx, "pay:order-A-1001")
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
//	resp, err := client.Do(req)
//	switch o := idemretry.OutcomeOf(resp, err); o.Kind {
//	case idemretry.Done: // the server's final answer
//	case idemretry.NotSent: // nothing reached the server
//	case idemretry.Pending: // may be done: resend the same action, or Resume
//	case idemretry.Refused: // not sent, for o.Reason
//	}
//
// One [Client] (or Transport on the default journal) per journal directory:
// a second one on it fails with filejournal.ErrLocked.
//
// # Actions and keys
//
// POST and PATCH carry keys ([WithKeyedMethods] adds methods,
// [WithUnkeyedMethods] takes them off). GET, HEAD, OPTIONS, TRACE, PUT and
// DELETE are idempotent by definition: they are retried under the same
// policy, without a key. Any other method is sent once. A key the caller sets
// on a method that is not keyed is passed through as it is, unchecked and not
// journaled.
//
// A keyed request belongs to one action, named in this order:
//
//   - the id given with [WithAction] (recommended);
//   - else an Idempotency-Key the caller set on the request, under any
//     spelling of the header name (bare or quoted, 1-255 visible ASCII
//     characters other than '"' and '\'): the server knows the action by its
//     key, so one key always means one payload;
//   - else a fingerprint of method, URL and body.
//
// When a request has both an id and a key, the id wins. The key on the
// action's first request becomes its key (else one is minted), and every
// later request of the action, restarts included, carries that journaled key
// whatever key it has. The id is the app's durable name for the action; an
// SDK's key lives only as long as one call (stripe-go mints one per call, so
// a restart would otherwise be a new charge). The price: a new payment needs
// a new id, and one key under two ids is two actions here (the server judges
// the second).
//
// An unnamed request cannot tell a double tap from a deliberate repeat. An
// identical request while the first is in flight or pending is the same
// action. One that arrives after the first finished is a new payment, with a
// new key, unless it comes within [WithDuplicateWindow] of the first (off by
// default; with sqljournal, judged by the earlier of the machine's clock and
// the database's). [WithRequireAction] refuses unnamed keyed requests with
// [ErrActionRequired] before anything is sent: payment apps should use it.
//
// A 307/308 hop that [http.Client] follows is a sub-action: it gets a key of
// its own, or carries the caller's key if the caller set one.
//
// A key goes out in one form for good: the one it was first sent in, bare
// (8e03978e-...) or quoted ("8e03978e-...", the IETF draft's Structured
// Field string), recorded with it (journal.Record.KeyForm) and used for
// every later attempt and request of its action and by Resume, after a
// restart too, whatever [WithQuotedKey] says by then. Servers take the two
// forms for two keys (express-idempotency and @node-idempotency/nestjs
// would charge twice; Fiber refuses the quoted one). A key the caller sets
// goes out as the caller wrote it, whatever WithQuotedKey says; "K" and K
// are one key, as the draft has it, so one action ("key:K"), and a later
// request of it written in the other form goes out in the first one. A
// minted key takes WithQuotedKey's form. A hop carrying the caller's key
// sends it as its parent did. A record without a form (written by a
// release before forms were recorded, or by a journal that keeps none: a
// third-party one that fails journaltest) goes out in WithQuotedKey's
// form, as it did then.
//
// # One flight per action
//
// A keyed request that arrives while a request of the same action is in
// flight in the same Transport sends nothing. It waits for that flight,
// bounded by its own context, and gets its own readable copy of the one
// response: held in memory up to [WithMaxSharedResponse] bytes and read for
// at most [DefaultMaxShareTime]. A larger body stays the first caller's, and
// the others get [ErrResponseNotShared] with the status; a 101 is never
// shared. A flight runs with its first caller's settings: the
// [WithRequestOptions] of a caller that joins it do not apply to it. If the
// first caller's context ends (or its Request.Cancel closes) with the action
// unfinished, or before the body was read for the others, a waiting caller
// carries it on under the same key, and the server replays. A caller takes a
// flight's answer only if it would itself reserve that action: an unnamed
// payment that finds a flight resending a done one (a tap's or Resume's)
// past the duplicate window is a new payment, sent once the flight lands
// (and the callers that so go again, with those that arrive meanwhile,
// are one tap: one payment);
// so is one that asks as another principal (another Authorization, Cookie,
// Stripe-Account or OpenAI-Organization header than the first caller's, or
// another header named *-Token, *-Key or *-Secret: two tenants' identical
// requests, or a token refreshed between two taps): the Transport never
// hands it the answer to another's request, and sends it, once the flight
// lands, under the action's key with its own credentials. A server that
// does not scope keys by principal answers it with the first's stored
// answer, and makes no payment of its own for it; so does one within
// [WithDuplicateWindow] of the first's, in flight or not: give each
// tenant its own Transport or actions.
//
// # Resume after a crash
//
// The journal keeps keys, never requests. At start-up, [Transport.Resume]
// (or [Client.Resume]) lists the journal's unfinished actions and asks the
// app's [Resumer] to rebuild each pending one. It is sent under its stored
// key with the usual rules (window, fingerprint, budget, one flight per
// action), so the server replays the original outcome or performs it once.
// Each [ResumeResult] carries the final answer, its body up to
// [DefaultMaxResumeBody]. An action whose key window ended is
// outcome-unknown: it is handed to [Resumer.Resolve] once the settle time
// ([WithSettleTime]) has passed, and never sent. A record the journal
// names corrupt ([journal.CorruptRecordsError]) does not hold up the others:
// it gets a result of its own, by id, with journal.ErrCorruptRecord, and
// nothing of it is sent. An app that never calls
// Close loses at most the last second of lazy updates: a done record then
// reads pending, and Resume resends it, which the server replays.
//
// # Guarantees
//
// Each has a test that fails without it.
//
//  1. Durable before sent. No attempt of a keyed request leaves the process
//     before its key is durable in the journal. If the journal cannot store
//     it, nothing is sent.
//  2. One key per action. All attempts of an action carry the same key,
//     across retries and restarts, until the key window ends. Across
//     goroutines this holds for a named action always, and for an unnamed
//     one within the in-flight rule: an identical request while the first is
//     in flight or pending joins it; one after the first finished is a new
//     action. Requests of one action in one Transport share one flight, so a
//     double tap sends one request and never races itself into a 409. A
//     307/308 hop that [http.Client] follows is part of its unnamed parent's
//     action: an identical request while the hop is in flight, or
//     unfinished in the journal (also after a restart), goes out under the
//     parent's key and follows the server's answer to the hop. It joins the
//     hop only if the server answers it with the same redirect, to the same
//     Location. The hop's done is synced before RoundTrip returns, as the
//     parent's is. Not covered: a request made while http.Client reads the
//     307's body and prepares the hop, a second redirect in a chain, and,
//     after a restart, a journal that hashes action ids. To tell a tap from
//     a repeat, a deliberate repeat of an unnamed payment costs one more
//     journal read.
//  3. No new key for an unknown outcome. When the window ends without a
//     definitive answer, the action becomes outcome-unknown. It is never
//     sent again, under its key or a new one, until the application
//     reconciles it and calls [journal.Journal.Forget].
//  4. Only what can heal is retried: network errors, 409, 429 and 5xx other
//     than 501 and 505. Never 400, 422 or another 4xx unless a server hint
//     says so. Never certificate errors, nor the caller's own cancellation:
//     its context's end, or its Request.Cancel, which RoundTrip makes its
//     context's end, as net/http does.
//  5. No hopeless waits. No wait starts that would end after the context's
//     deadline or the key window, and the window is checked again before
//     every attempt. Cancellation during a wait, or while joined to another
//     caller's flight, returns promptly. A request's journal calls end with
//     the caller's context and within [WithJournalTimeout], also when the
//     context reports a deadline it has no Done channel to signal. Only the
//     write of the outcome being returned may outlast the context, by at
//     most [OutcomeGrace]. The action's lease ([journal.Leaser]) is released
//     after RoundTrip returns. Resume's context bounds the requests it
//     sends; its listing of the unfinished actions ends with its context
//     alone. A discarded body is drained for at most [DefaultMaxDrainTime].
//  6. What the caller is given is what the journal records. An action is
//     recorded done only when a final answer is returned, and is then
//     final: no later write (a stale resend, another machine that saw a 409)
//     moves it out of done. A final answer that arrives as the caller's
//     context ends is returned and recorded done. If the journal cannot
//     record an outcome in time, the Transport keeps it in memory and writes
//     it before the action is reserved again (refusing that request, with
//     nothing sent, while it cannot) and at Close; meanwhile another
//     Transport on the same journal (another machine of a fleet) finds the
//     action pending, and sends an identical unnamed request under its
//     key, as a tap of it: the server answers with its replay, and makes
//     no payment of its own for it. MaybeProcessed is decided
//     from what was written on the wire, including net/http's own silent
//     resend on a broken keep-alive connection.
//  7. Hygiene. The caller's request is never modified. Every discarded
//     response body is drained (up to [DefaultMaxDrain] and
//     [DefaultMaxDrainTime]) and closed. No goroutine outlives its
//     RoundTrip. A response or an error, never both. A returned body read to
//     its end frees its attempt, closed or not, as net/http's does; a 101's
//     upgraded connection is freed at Close.
//  8. Nothing acknowledged is lost to a crash. Damage to acknowledged data is
//     reported as corruption, with the file and offset, except in the
//     file's last frame, which cannot be told from a write torn by a crash
//     (every storage engine makes this choice): it is copied aside, cut off,
//     reported in the journal's recovery report and logged, and its records
//     are lost.
//  9. One payload per action. An action id or caller key reused with a
//     different method, URL or body fails with [ErrFingerprintMismatch]
//     before anything is sent, whether the first request is in flight or
//     recorded. The check is a SHA-256 of method, URL and body. For a named
//     action whose body is 512 bytes or more, and of a length known before it
//     is read, it is a MAC under a key made from the journal's fingerprint
//     secret ([journal.FingerprintKeeper]), when the journal keeps one. The
//     secret is in no record, so no one without it can craft another body
//     that passes for the first. A keyed fingerprint that cannot be checked
//     (its secret lost, or AES-GCM refused under GODEBUG=fips140=only)
//     refuses the action with [ErrFingerprintUncheckable], nothing sent,
//     until its key window ends; then it is outcome-unknown. A key the
//     Transport minted for one action, set by hand on a different request,
//     names a different action (the server's own check is the guard there):
//     do not copy minted keys into headers.
//
// Windows are wall-clock spans. They are judged by the [Clock] or, when the
// journal keeps a later time ([journal.Timekeeper]: the file journal's
// latest seen time, sqljournal's database clock), up to a day later, by that
// time. So a clock set back or running behind cannot make a key look
// younger, while a key minted by the current request is aged from its
// minting. A key created in the clock's future is refused with
// [ErrClockSkew] and left as it is, and [NewTransport] logs a clock that is
// behind times its journal has seen. What no journal can tell: a key minted
// while the clock ran ahead, and used only after the corrected clock has
// passed its creation time, looks younger than it is by that lead, and can be
// sent that much after its window (a phone whose date the user set forward,
// paid, then set right). Keep [WithKeyWindow] below the server's retention by
// the clock error you mean to tolerate.
//
// # Errors
//
// Errors are typed: test them with [errors.Is] and [errors.As], or sort any
// result with [OutcomeOf]. When an action's attempts end without a response
// to return, RoundTrip returns an [*ActionError]. It names the action, its
// key and its attempts. MaybeProcessed is false only when no attempt, in this
// run or an earlier one, can have reached the server. It unwraps to the
// reason ([ErrAttemptsExhausted], [ErrKeyWindowExpired], [ErrClockSkew],
// [ErrWaitExceedsDeadline], [ErrFingerprintMismatch], [ErrResponseNotShared],
// [ErrParked], [ErrKeyReused], [ErrNotResumable], ...) and to the last cause
// (the network error, or the context's). Reason is nil when the attempt's own
// error ended the action (a certificate failure, the caller's cancellation
// or deadline): test Err then. With [context.WithCancelCause], net/http
// returns the cause given instead of [context.Canceled]. For methods without
// a key, Action and Key are empty.
//
// After the last attempt on a retryable status, the caller gets that
// response with its body unread and a nil error, as the RoundTripper
// contract requires. [GiveUpReason] returns why the retries stopped
// ([ErrAttemptsExhausted], [ErrRetryAfterTooLong], [ErrWaitExceedsDeadline],
// or the context's error), and nil for a final answer; [OutcomeOf] calls it
// Pending. Every give-up is logged at Warn with [WithLogger]. The action
// stays pending: resend it and it keeps its key.
//
// Before anything is sent: [ErrInvalidRequest], [ErrInvalidKey],
// [ErrInvalidAction], [ErrActionRequired], [ErrBodyTooLarge], or the
// journal's error: [journal.ErrClosed], [journal.ErrUnavailable] when it did
// not answer in time, [journal.ErrInvalidRecord], or
// [journal.ErrCorruptRecord] when the action's stored record is one no
// journal writes (nothing is sent until it is repaired or forgotten).
// [NewClient] and [NewTransport] return [ErrInvalidOption] (also for a bad
// filejournal option given to [WithJournalDir]), filejournal.ErrLocked (its
// message names the directory and, on Unix, the holder's pid),
// filejournal.ErrCorrupt or [journal.ErrIncompatible].
//
// # Logs, events and counters
//
// [WithLogger] takes a *slog.Logger; nothing is logged by default. A normal
// retry is logged at Debug. At Warn: an action that gives up (and why), is
// parked by the budget, or whose outcome becomes unknown (key window ended,
// key refused as reused), an outcome the journal could not record in time,
// and what opening the journal repaired. Keys and action ids are logged;
// request bodies, headers and credentials never are.
//
// [WithObserver] is told of every [Event] on the RoundTrip's goroutine:
// attempt (status or error, duration), retry (the wait), done (status,
// replayed or not), give-up (reason), parked, unknown (reason), resumed, and
// the journal's reserve and sync (duration). An observer that panics is
// recovered and logged at Error: it cannot break a RoundTrip.
//
// [Transport.Stats] is a snapshot taken with atomic loads (the request path
// pays atomic adds only). Attempts counts each request the base wrote (one
// for an attempt that wrote nothing, such as a refused dial), so a stacked
// retrying base and net/http's own silent resend count as the server saw
// them.
//
// # Defaults
//
// Every default is an exported Default* constant: [DefaultBaseDelay],
// [DefaultMaxDelay], [DefaultMaxRetries], [DefaultBudgetTokens],
// [DefaultBudgetRatio], [DefaultKeyWindow], [DefaultMaxRetryAfter],
// [DefaultMaxBufferedBody], [DefaultMaxSharedResponse], [DefaultMaxShareTime],
// [DefaultSettleTime], [DefaultJournalTimeout], [DefaultMaxDrain],
// [DefaultMaxDrainTime], [DefaultLeaseTTL] and [DefaultResumeConcurrency].
// Each says why it has its value.
package idemretry
