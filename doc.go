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
// you already have ([NewTransport]):
//
//	client, err := idemretry.NewClient(idemretry.WithRequireAction())
//	if err != nil { ... }
//	defer client.Close()
//	ctx = idemretry.WithAction(ctx, "pay:order-A-1001")
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
//	resp, err := client.Do(req)
//
// # Actions and keys
//
// POST and PATCH carry keys ([WithKeyedMethods]). GET, HEAD, OPTIONS, TRACE,
// PUT and DELETE are idempotent by definition: they are retried under the
// same policy, without a key. Any other method is sent once.
//
// A keyed request belongs to one action, named in this order:
//
//   - an Idempotency-Key the caller set on the request, under any spelling of
//     the header name: the server knows the action by its key, so one key
//     always means one payload;
//   - else the id given with [WithAction] (recommended);
//   - else a fingerprint of method, URL and body.
//
// An unnamed request cannot tell a double tap from a deliberate repeat. An
// identical request while the first is in flight or pending is the same
// action. One that arrives after the first finished is a new payment, with
// a new key, unless it comes within [WithDuplicateWindow] of the first.
// [WithRequireAction] refuses unnamed keyed requests with [ErrActionRequired]
// before anything is sent: payment apps should use it.
//
// A 307/308 hop that [http.Client] follows is a sub-action: it gets a key of
// its own, or carries the caller's key if the caller set one.
//
// # One flight per action
//
// A keyed request that arrives while a request of the same action is in
// flight in the same Transport sends nothing. It waits for that flight,
// bounded by its own context, and gets its own readable copy of the one
// response (up to [WithMaxSharedResponse] bytes, read for at most
// [DefaultMaxShareTime]). A flight runs with its first caller's settings. If
// the first caller's context ends with the action unfinished, a waiting
// caller carries it on under the same key.
//
// # Resume after a crash
//
// The journal keeps keys, never requests. At start-up, [Transport.Resume]
// lists the journal's unfinished actions and asks the app's [Resumer] to
// rebuild each pending one; it is sent under its stored key, so the server
// replays the original outcome or performs it once. An action whose key
// window ended is outcome-unknown: it is handed to [Resumer.Resolve], never
// sent.
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
//     one within the in-flight rule above.
//  3. No new key for an unknown outcome. When the window ends without a
//     definitive answer, the action becomes outcome-unknown. It is never
//     sent again, under its key or a new one, until the application
//     reconciles it and calls [journal.Journal.Forget].
//  4. Only what can heal is retried: network errors, 409, 429 and 5xx other
//     than 501 and 505. Never 400, 422 or another 4xx unless a server hint
//     says so; never certificate errors, nor the caller's own cancellation.
//  5. No hopeless waits. No wait starts that would end after the context's
//     deadline or the key window. A request's journal calls end with the
//     caller's context and within [WithJournalTimeout]. Only the write of
//     the outcome being returned may outlast the context, by at most
//     [OutcomeGrace]. A discarded body is drained for at most
//     [DefaultMaxDrainTime].
//  6. What the caller is given is what the journal records. An action is
//     recorded done only when a final answer is returned, and is then final.
//     A final answer that arrives as the caller's context ends is returned
//     and recorded done. An outcome the journal cannot take in time is kept
//     in memory and written before the action is reserved again, and at
//     Close.
//  7. Hygiene. The caller's request is never modified. Every discarded
//     response body is drained and closed. No goroutine outlives its
//     RoundTrip. A response or an error, never both.
//  8. Nothing acknowledged is lost to a crash. Damage to acknowledged data is
//     reported as corruption, with the file and offset, except in the
//     file's last frame, which cannot be told from a write torn by a crash:
//     it is copied aside and cut off (see package filejournal).
//  9. One payload per action. An action id or caller key reused with a
//     different method, URL or body fails with [ErrFingerprintMismatch]
//     before anything is sent.
//
// Windows are wall-clock spans. They are judged by the [Clock] or, when the
// journal keeps a later time ([journal.Timekeeper]), by that time, so a
// clock set back cannot make a key look younger. A key created in the
// clock's future is refused with [ErrClockSkew]. What no journal can tell: a
// key minted while the clock ran ahead looks younger than it is by that
// lead. Keep [WithKeyWindow] below the server's retention by the clock error
// you mean to tolerate.
//
// # Errors
//
// Errors are typed: test them with [errors.Is] and [errors.As]. When an
// action's attempts end without a response to return, RoundTrip returns an
// [*ActionError]. It names the action, its key and its attempts, says
// whether an attempt may have reached the server (MaybeProcessed), and
// unwraps to the reason and to the last cause. The reasons are listed in
// errors.go.
//
// After the last attempt on a retryable status, the caller gets that
// response with a nil error, as the RoundTripper contract requires.
// [GiveUpReason] tells it from a final answer. The action stays pending:
// resend it and it keeps its key.
//
// Before anything is sent: [ErrInvalidRequest], [ErrInvalidKey],
// [ErrInvalidAction], [ErrActionRequired], [ErrBodyTooLarge], or the
// journal's error ([journal.ErrClosed], [journal.ErrUnavailable]).
// [NewTransport] returns [ErrInvalidOption] for a bad option.
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
