// Package otelidemretry instruments an idemretry Transport with
// OpenTelemetry, the way go.opentelemetry.io/contrib's otelhttp instruments
// an http.RoundTripper: a client span per RoundTrip with an event per
// attempt, and metrics from the Transport's events and counters. It is a
// module of its own, so that idemretry itself depends on no OpenTelemetry
// package. It is named as otelhttp is, so that it needs no alias beside
// go.opentelemetry.io/otel.
//
//	inst, err := otelidemretry.New(otelidemretry.WithTracerProvider(tp), otelidemretry.WithMeterProvider(mp))
//	if err != nil { ... }
//	defer inst.Close()
//	tr, err := inst.NewTransport(nil, idemretry.WithJournalDir(dir))
//	if err != nil { ... }
//	defer tr.Close()
//	client := &http.Client{Transport: tr}
//
// NewTransport takes the same arguments as idemretry.NewTransport and
// returns a Transport that wraps one (Unwrap returns it, for Stats, Resume
// and Journal). The package-level NewTransport does the same with the
// global providers (go.opentelemetry.io/otel's GetTracerProvider and
// GetMeterProvider).
//
// # Spans
//
// Each RoundTrip is a span of kind client named "idemretry " and the method
// ("idemretry POST"), a child of the span in the request's context, with
// the attributes of the OpenTelemetry HTTP client conventions and the
// action's:
//
//   - http.request.method (and http.request.method_original), url.full,
//     server.address, server.port; url.full has no user name or password and
//     every query value reads REDACTED.
//   - http.response.status_code of the response returned; error.type (see
//     Errors); the status is Error for an error, a 4xx or a 5xx.
//   - idemretry.attempts: requests this RoundTrip wrote, as Stats.Attempts
//     counts them (see Metrics): one per attempt event, more where the base
//     sent an attempt again by itself; 0 for a request that joined an
//     action in flight, or that was refused before sending.
//   - idemretry.replayed: the response is the server's replay of a stored
//     answer (set on every final answer, true or false).
//   - idemretry.reason: why the attempts ended without a final answer:
//     attempts_exhausted, retry_after_too_long, wait_exceeds_deadline,
//     parked, key_window_expired, key_reused, fingerprint_mismatch,
//     fingerprint_uncheckable, response_not_shared, canceled,
//     deadline_exceeded, or other.
//   - idemretry.maybe_processed: for an *idemretry.ActionError, whether the
//     server may have performed the action.
//   - idemretry.key.hash, idemretry.action.hash: the first 8 bytes of the
//     SHA-256 of the action's key and id, in hex (an HMAC-SHA-256 with
//     WithHashSecret; neither with WithoutHashes). The key and the id are
//     never recorded: not as attributes, nor in an error message, where
//     each is replaced by its hash. A key is found under any spelling of
//     its header's name (h["idempotency-key"], set directly, is sent as is
//     and idemretry takes it), and every value is hidden, also those
//     idemretry refuses.
//
// Each attempt is an event "idemretry.attempt" on the span, at the time it
// ended, with idemretry.attempt (1, 2, ... in this RoundTrip),
// idemretry.attempt.duration (seconds), and http.response.status_code, or
// error.type and error.message for a transport error. The attempts carry
// the span's context in their headers (WithPropagators; the global
// propagator by default). For a span per attempt as well, give
// otelhttp.NewTransport(...) as the base: its spans are children of this
// one. The span ends when the response body is closed or read to its end,
// or at once with an error. A 101 Switching Protocols' body stays the
// io.ReadWriteCloser net/http makes it (the upgraded connection, for a
// WebSocket or h2c upgrade); its span ends when it is closed.
//
// # Errors
//
// error.type follows the semantic conventions' rule
// (https://opentelemetry.io/docs/specs/semconv/registry/attributes/error/
// and the HTTP client span's): predictable and of low cardinality. For a
// 4xx or 5xx answer it is the status code ("503"). For an error it is the
// first of these that applies, looking through the wrappers that classify
// nothing (fmt.Errorf's %w, errors.Join, *url.Error):
//
//   - the answer of the error's ErrorType method, if it has one;
//   - timeout, for context.DeadlineExceeded or an error whose Timeout
//     method says so (a net.Error);
//   - the name of a well-known error value: io.EOF (the connection closed
//     before the answer), io.ErrUnexpectedEOF, context.Canceled,
//     net.ErrClosed, net/http.ErrSchemeMismatch,
//     net/http.ErrBodyReadAfterClose, and idemretry's and journal's
//     exported errors by package path and name
//     (github.com/idemretry/idemretry.ErrAttemptsExhausted,
//     github.com/idemretry/idemretry/journal.ErrClosed);
//   - the package path and name of its type, a pointer's element type for
//     a pointer (net.OpError, crypto/tls.CertificateVerificationError,
//     github.com/idemretry/idemretry.ActionError);
//   - _OTHER, for an errors.New value of no known name.
//
// # Metrics
//
// From the Transport's events (idemretry.Event), so that each total equals
// the idemretry.Stats field named after it:
//
//   - idemretry.attempts {attempt} and idemretry.attempt.duration (s,
//     histogram), by http.response.status_code or error.type: one for each
//     request written (and one for an attempt that wrote none, a refused
//     dial), as Stats.Attempts counts them. Requests, not attempts: they
//     are what the server saw and may have acted on, and a base that
//     retries by itself, or net/http's resend of a request cut on a reused
//     connection, writes more than one per attempt. Only the attempt is
//     timed, so its requests share its time equally.
//   - idemretry.retries {retry}, by the retried attempt's
//     http.response.status_code or error.type.
//   - idemretry.done {action}, by idemretry.replayed: the true ones are
//     Stats.Replays.
//   - idemretry.give_ups {action}, by idemretry.reason: attempts_exhausted,
//     retry_after_too_long, wait_exceeds_deadline, or other (the caller's
//     context, or an error that is not retried): Stats.GiveUps*.
//   - idemretry.parked {action}, idemretry.unknown {action} (by
//     idemretry.reason: key_window_expired or key_reused), idemretry.resumed
//     {action}.
//   - idemretry.journal.reserve.duration (s, histogram): each reservation
//     of a key on the request path, before the first attempt leaves. For a
//     durable journal that creates the record (a new action), it is the
//     record's write and sync (an fdatasync for filejournal, which shares
//     one among concurrent reservations); a repeat that finds its record
//     writes nothing. Its count and sum are Stats.Reserves and ReserveTime.
//   - idemretry.journal.sync.duration (s, histogram): each journal sync
//     the Transport asks for (the done of an action named by its
//     fingerprint): Stats.Syncs and SyncTime.
//
// Watching fsync latency on the request path is watching both histograms:
// a new action's sync is inside its reservation, not a Sync.
//
// From Stats, summed over the Transports that the Instrumentation made:
// idemretry.journal.reserves {reservation} and idemretry.journal.syncs
// {sync}, the same counts as the histograms'.
//
// An Observer runs on the RoundTrip's goroutine and gets no context, so the
// metrics are recorded without one (no exemplars).
//
// # Resume
//
// Transport.Resume is idemretry's Resume with a span per action sent again,
// marked idemretry.resumed; Unwrap().Resume sends them without spans (their
// metrics are recorded either way).
package otelidemretry
