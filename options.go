package idemretry

import (
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/internal/httptoken"
	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"
)

// Defaults of the Transport's options. Each one is documented where it is set.
const (
	// DefaultKeyWindow is how long a server keeps an Idempotency-Key: Stripe
	// prunes keys once they are at least 24 hours old. Match it to your
	// server's documented retention with WithKeyWindow. It is
	// journal.DefaultKeyWindow, which the journals are told by default.
	DefaultKeyWindow = journal.DefaultKeyWindow
	// DefaultMaxRetryAfter caps how long the Transport honours a Retry-After
	// header. A longer Retry-After ends the retries at once and the response
	// is returned to the caller.
	DefaultMaxRetryAfter = 30 * time.Second
	// DefaultMaxBufferedBody is how much of a request body without GetBody
	// the Transport buffers in memory to be able to resend it. A larger body
	// is refused with ErrBodyTooLarge; set Request.GetBody to stream it.
	DefaultMaxBufferedBody = 1 << 20
	// DefaultMaxDrain is how much of a discarded response body is read
	// before it is closed, so that its connection can be reused.
	DefaultMaxDrain = 64 << 10
	// DefaultKeyHeader is the header that carries the key.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultMaxDrainTime is how long a discarded response body may take to
	// drain; one that stalls longer is cut, and its connection dropped. It
	// also bounds the reads that judge an answer (the RetryPolicy's, and
	// KeyReuseRejected's of a 400, 409 or 422): a body that stalls longer
	// while judged is cut, for the caller and a flight's joiners alike.
	DefaultMaxDrainTime = 200 * time.Millisecond
	// DefaultJournalTimeout is the longest any journal call on the request
	// path may take (WithJournalTimeout); the caller's context bounds it
	// further. A Reserve cut short by it fails with journal.ErrUnavailable,
	// and nothing is sent.
	DefaultJournalTimeout = 5 * time.Second
	// DefaultMaxSharedResponse is how much of a response body is held in
	// memory to give each caller that joined an action's flight its own copy
	// (WithMaxSharedResponse).
	DefaultMaxSharedResponse = 1 << 20
	// DefaultMaxShareTime is how long RoundTrip may read a final answer's
	// body to copy it for the callers that joined its flight. A body not
	// read by then is cut (its attempt's context is cancelled): the first
	// caller gets what was read followed by the error, the others
	// ErrResponseNotShared. The outcome stays recorded.
	DefaultMaxShareTime = 5 * time.Second
	// DefaultSettleTime is how long after its key window ended an
	// outcome-unknown action must wait before [Transport.Resume] hands it
	// to the Resumer's Resolve ([WithSettleTime]). An attempt may start
	// until the window ends. A request still in the network or at the
	// provider may be processed after that. A provider that says "no
	// charge" before then may be wrong.
	DefaultSettleTime = time.Minute
)

// An Option configures a [Transport] (and a [Client]). Options apply in
// order, and a later one overrides an earlier one, with three exceptions.
// The journal is named once ([WithJournal] or [WithJournalDir]).
// [WithKeyedMethods] and [WithUnkeyedMethods] add to the methods named
// before. [WithObserver] adds an observer (a nil one adds none).
//
// [NewTransport] validates all options in one place. A value an option
// cannot use (a negative count or duration, a header name that is not a
// token, an empty journal directory...) makes it fail with an error
// wrapping [ErrInvalidOption]. A nil function given to another option
// restores its default. A size or duration limit may be as large as
// [math.MaxInt64], the usual way to say "no limit": the Transport's sums of
// limits saturate, never wrap.
type Option func(*config)

type config struct {
	journal     journal.Journal
	journalDir  string
	journalOpts []filejournal.Option
	// journalBy names the options that named the journal (WithJournal,
	// WithJournalDir), in order: validate allows one.
	journalBy     []string
	newBackOff    func() backoff.BackOff
	maxRetries    int
	policy        RetryPolicy
	maxRetryAfter time.Duration
	keyWindow     time.Duration
	clock         Clock
	newTimer      func() Timer // the clock's timers (timersOf), set by validate
	// keyed is the set of methods that carry a key, which validate makes:
	// POST and PATCH, with addKeyed, without unkeyed.
	keyed       map[string]bool
	addKeyed    []string
	unkeyed     []string
	quoted      bool
	header      string
	observers   []Observer
	logger      *slog.Logger
	maxBuffered int64
	maxDrain    int64
	newKey      func() (string, error)

	budget          *budget
	requireAction   bool
	duplicateWindow time.Duration
	journalTimeout  time.Duration
	maxShared       int64
	leaseTTL        time.Duration // lease.go: WithLeaseTTL
	settle          time.Duration // reconcile.go: WithSettleTime
}

func defaultConfig() config {
	c := config{
		maxRetries:    DefaultMaxRetries,
		policy:        DefaultRetryPolicy,
		maxRetryAfter: DefaultMaxRetryAfter,
		keyWindow:     DefaultKeyWindow,
		clock:         systemClock{},
		header:        DefaultKeyHeader,
		maxBuffered:   DefaultMaxBufferedBody,
		maxDrain:      DefaultMaxDrain,
		newKey:        newUUIDKey,

		budget:         newBudget(DefaultBudgetTokens, DefaultBudgetRatio),
		journalTimeout: DefaultJournalTimeout,
		maxShared:      DefaultMaxSharedResponse,
		settle:         DefaultSettleTime,
	}
	return c
}

// defaultKeyedMethods carry a key unless WithUnkeyedMethods takes them out.
var defaultKeyedMethods = []string{http.MethodPost, http.MethodPatch}

// WithBackOff sets how the Transport waits between attempts. newBackOff is
// called once per RoundTrip, as it begins, and the BackOff reset then (an
// ExponentialBackOff's MaxElapsedTime counts the whole RoundTrip), so
// stateful backoffs are never shared; it must be safe for concurrent use.
// If it returns nil, RoundTrip fails with ErrInvalidOption before anything
// is sent. If a BackOff returns backoff.Stop, the retries end. The default
// (and what a nil newBackOff restores) is full jitter with DefaultBaseDelay
// and DefaultMaxDelay.
func WithBackOff(newBackOff func() backoff.BackOff) Option {
	return func(c *config) {
		c.newBackOff = newBackOff // nil: the default
	}
}

// WithMaxRetries sets how many retries may follow the first attempt
// (default DefaultMaxRetries). Zero disables retries but keeps the keys; a
// negative n is invalid.
func WithMaxRetries(n int) Option { return func(c *config) { c.maxRetries = n } }

// WithRetryPolicy replaces DefaultRetryPolicy. A nil policy restores it.
func WithRetryPolicy(p RetryPolicy) Option {
	return func(c *config) {
		if p == nil {
			p = DefaultRetryPolicy
		}
		c.policy = p
	}
}

// WithMaxRetryAfter caps how long a Retry-After header may make the
// Transport wait (default DefaultMaxRetryAfter). A response asking for more
// is returned to the caller at once.
func WithMaxRetryAfter(d time.Duration) Option { return func(c *config) { c.maxRetryAfter = d } }

// WithKeyWindow sets how long after its creation a key may still be sent
// (default [DefaultKeyWindow]). Set it to your server's key retention, or
// less.
//
// Windows are wall-clock spans, as the server's retention is. They are
// judged by the Transport's [Clock]. When the journal has seen a later time
// ([filejournal.Journal.Now]) no more than [journal.DefaultGrace] ahead,
// they are judged by that time, so a clock set back cannot make a key look
// younger. A key whose creation lies more than a minute in the future even
// so is refused with [ErrClockSkew].
func WithKeyWindow(d time.Duration) Option { return func(c *config) { c.keyWindow = d } }

// WithClock replaces the system clock, for tests and simulations. The
// Transport reads the key window from it. It waits on the clock's timers if
// it is a [TimerClock], on the system's otherwise. A journal the Transport
// opens gets the same clock. Give a journal you pass with [WithJournal] the
// same clock too ([filejournal.WithClock]), or its expiry and the key
// window disagree. Context deadlines are judged against the clock's
// durations as if they were real time.
func WithClock(clk Clock) Option {
	return func(c *config) {
		if clk == nil {
			clk = systemClock{}
		}
		c.clock = clk
	}
}

// WithKeyedMethods adds methods to those that carry an Idempotency-Key:
// POST and PATCH always do, unless WithUnkeyedMethods takes them out. Each
// call adds; none replaces, and none with no method changes anything. A
// keyed request is journaled, retried under its one key and guarded by
// WithRequireAction. Of the methods that are not keyed, GET, HEAD, OPTIONS,
// TRACE, PUT and DELETE (idempotent by definition) are retried without a
// key, and any other method is sent once.
//
// A method is named as it is sent, in upper case ("PUT"): methods are
// case-sensitive (RFC 9110), and a request's is matched exactly. A name
// that is not an HTTP token or has a lower-case letter ("put") fails
// NewTransport with ErrInvalidOption, as does a method that
// WithUnkeyedMethods names too.
func WithKeyedMethods(methods ...string) Option {
	return func(c *config) { c.addKeyed = append(c.addKeyed, methods...) }
}

// WithUnkeyedMethods sends methods without an Idempotency-Key, POST and
// PATCH included: the one way to take a key off them (for an endpoint that
// refuses the header, say; give it a Transport of its own). Such a request
// is not journaled, and WithRequireAction does not apply to it. A POST or
// PATCH without a key is sent once, never retried: a retry could perform
// it twice. Method names follow WithKeyedMethods' rule; a method named by
// both options fails NewTransport with ErrInvalidOption, whatever their
// order.
func WithUnkeyedMethods(methods ...string) Option {
	return func(c *config) { c.unkeyed = append(c.unkeyed, methods...) }
}

// validMethod reports whether m is a method name WithKeyedMethods and
// WithUnkeyedMethods accept: an HTTP token without a lower-case letter.
func validMethod(m string) bool {
	return httptoken.Valid(m) && strings.ToUpper(m) == m
}

// WithQuotedKey sends the keys the Transport mints in the IETF draft's
// Structured Field string form, "8e03978e-...", instead of bare (Stripe's
// form, the default). A key keeps the form it was first sent in, recorded
// with it: an action minted before the option was switched goes on in its
// first form, and a key the caller sets goes out as written (see "Actions
// and keys" in the package doc).
func WithQuotedKey() Option { return func(c *config) { c.quoted = true } }

// WithKeyHeader sets the header that carries the key (default
// [DefaultKeyHeader]; some servers want X-Idempotency-Key). A header to
// which HTTP gives a meaning of its own fails [NewTransport] with
// [ErrInvalidOption]. These are:
//
//   - Host, Content-Length, Transfer-Encoding, Trailer and Expect: net/http
//     never sends them as given, or the server refuses the request;
//   - the hop-by-hop headers a proxy drops: Connection, Keep-Alive,
//     Proxy-Connection, TE and Upgrade;
//   - the Content-* headers, Authorization, Proxy-Authorization and Cookie:
//     the key would replace the request's own, which would be taken for
//     its key.
func WithKeyHeader(name string) Option {
	return func(c *config) { c.header = http.CanonicalHeaderKey(strings.TrimSpace(name)) }
}

// meaningfulHeader reports whether name, canonical, is a header that
// WithKeyHeader refuses.
func meaningfulHeader(name string) bool {
	switch name {
	case "Host", "Content-Length", "Transfer-Encoding", "Trailer", "Expect",
		"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Upgrade",
		"Authorization", "Proxy-Authorization", "Cookie":
		return true
	}
	return strings.HasPrefix(name, "Content-")
}

// WithLogger makes the Transport log to l: each retry at Debug level, and a
// request of a named action whose own key is replaced by the action's, an
// action that becomes outcome-unknown at Warn. Keys are logged; request
// bodies and headers never are. The default logs nothing.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithMaxBufferedBody sets how much of a request body without GetBody is
// buffered to be resent (default DefaultMaxBufferedBody).
func WithMaxBufferedBody(n int64) Option { return func(c *config) { c.maxBuffered = n } }

// WithKeyGenerator replaces the UUIDv4 generator, for reproducible
// simulations. gen must return keys of at most 255 visible ASCII characters
// that are unique per action. It must be safe for concurrent use.
//
// The default generator reads [crypto/rand.Reader] at each key. A Reader
// your program put in its place is used, and its error returned.
// google/uuid's SetRand and EnableRandPool do not apply to it. To choose
// where keys come from, pass a generator here.
func WithKeyGenerator(gen func() (string, error)) Option {
	return func(c *config) {
		if gen == nil {
			gen = newUUIDKey
		}
		c.newKey = gen
	}
}

// WithRetryBudget sets the Transport's retry budget (default
// DefaultBudgetTokens and DefaultBudgetRatio): a token bucket holding at most
// tokens, that every first attempt fills by ratio and every retry drains by
// one. A retry that finds less than a token is not made: the action is
// parked (ErrParked) with its key. Isolated failures find the bucket full
// and get every retry; in a total outage retries add about ratio to the
// first attempts (plus the capacity, once). tokens == 0 turns the budget
// off: every retry the other limits allow is made.
func WithRetryBudget(tokens, ratio float64) Option {
	return func(c *config) { c.budget = newBudget(tokens, ratio) }
}

// WithRequireAction makes every keyed request name its action, with a key
// set by the caller or a WithAction id; one that does not fails with
// ErrActionRequired before anything is sent. This is the strict form a
// payment app should use: an unnamed request is identified by its method,
// URL and body, which cannot tell a double tap that arrives after the first
// tap's answer from a deliberate second payment.
func WithRequireAction() Option { return func(c *config) { c.requireAction = true } }

// WithDuplicateWindow makes an unnamed keyed request that repeats a
// completed one (the same method, URL and body) the same action, if it
// comes within d of the first's key being minted. It is sent with the same
// key, and the server answers with its replay. Braintree's servers apply
// such a window for 30 s to catch double submissions.
//
// The window is off (0) by default: it also turns a deliberate identical
// payment within d into a replay of the first. Prefer naming actions
// ([WithAction]). d must be shorter than the key window. It is judged when
// the request arrives (RoundTrip is called), by the earlier of the clock
// and the journal's time ([journal.Timekeeper]; sqljournal keeps the
// database's): a double tap must not pass for a new payment because one
// clock runs ahead of the other, or because the journal was slow. A
// payment made after the request arrived (by more than the minute a
// fleet's clocks may disagree) is not one it repeats, when the journal
// keeps a time that never goes back to tell so by (file journal,
// sqljournal); without one, the wall clock cannot tell a later payment
// from a clock set back, and the request is taken for a tap.
func WithDuplicateWindow(d time.Duration) Option { return func(c *config) { c.duplicateWindow = d } }

// WithJournalTimeout bounds every journal call on the request path
// (default [DefaultJournalTimeout]), whatever the caller's context allows.
// An outcome that could not be recorded in time is kept in memory. It is
// written before its action is reserved again, or at [Transport.Close]. A
// call whose context has neither a deadline nor a Done channel
// ([context.Background]'s) shares its timer with the calls that start
// within 1/100 of d of it (for d of 100 ms or more). It may so be cut short
// by up to d/100.
func WithJournalTimeout(d time.Duration) Option { return func(c *config) { c.journalTimeout = d } }

// WithSettleTime sets how long after its key window ended an
// outcome-unknown action waits before [Transport.Resume] hands it to
// Resolve (default [DefaultSettleTime]). The wait is judged by the clock,
// or by the journal's time ([journal.Timekeeper]; sqljournal keeps the
// database's) where that is behind the clock. 0 hands the action over as
// soon as the window ends.
//
// d must exceed how long a request can stay in the network or at the
// provider. For a fleet, add how far a machine's clock may run behind the
// others'. With sqljournal, that is behind the database's: such a
// machine's keys are stored with its own, earlier, time. An action made
// outcome-unknown early (the server refused its key as reused,
// [ErrKeyReused]) waits for its window to end too.
func WithSettleTime(d time.Duration) Option { return func(c *config) { c.settle = d } }

// WithMaxSharedResponse sets how much of a response body is held in memory
// to share it among the callers of one flight (default
// DefaultMaxSharedResponse); see Transport.RoundTrip.
func WithMaxSharedResponse(n int64) Option { return func(c *config) { c.maxShared = n } }

func defaultBackOff() backoff.BackOff {
	return NewFullJitter(DefaultBaseDelay, DefaultMaxDelay, nil)
}

// validate checks every option's value, in one place: a value an option
// cannot use fails NewTransport with an error wrapping ErrInvalidOption.
// Limits are checked for their sign alone: any size or duration from zero
// (or one) up to math.MaxInt64, the usual way to say "no limit", is used
// as given (the sums of limits saturate: limits.go). It sets the clock's
// timers (timersOf) and makes the set of keyed methods (makeKeyed).
func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
	newTimer, ok := timersOf(c.clock)
	if !ok {
		return bad("clock %T has a NewTimer method that does not return an idemretry.Timer", c.clock)
	}
	c.newTimer = newTimer
	b := c.budget
	switch {
	case b.capacity < 0 || b.capacity != b.capacity:
		return bad("retry budget of %v tokens, want >= 0", b.capacity)
	case b.ratio < 0 || b.ratio > 1 || b.ratio != b.ratio:
		return bad("retry budget ratio %v, want 0 to 1", b.ratio)
	case b.capacity > 0 && b.capacity < 1:
		return bad("retry budget of %v tokens allows no retry; use 0 to turn it off", b.capacity)
	case c.leaseTTL < 0 || (c.leaseTTL > 0 && c.leaseTTL < time.Millisecond):
		return bad("lease TTL %v, want 0 (the default) or at least 1ms", c.leaseTTL)
	case c.maxRetries < 0:
		return bad("max retries %d, want >= 0", c.maxRetries)
	case c.keyWindow <= 0:
		return bad("key window %v, want > 0", c.keyWindow)
	case c.maxRetryAfter < 0:
		return bad("max Retry-After %v, want >= 0", c.maxRetryAfter)
	case !httptoken.Valid(c.header):
		return bad("key header name %q is not an HTTP token", c.header)
	case meaningfulHeader(c.header):
		return bad("key header %s has a meaning of its own in HTTP: the key would not reach the server as sent, or would replace what the request says", c.header)
	case len(c.journalBy) > 1:
		return bad("the journal is named %d times (%s): give one WithJournal or WithJournalDir", len(c.journalBy), strings.Join(c.journalBy, ", "))
	case len(c.journalBy) == 1 && c.journalBy[0] == "WithJournal" && isNil(c.journal):
		return bad("WithJournal(nil); leave WithJournal out for the default directory")
	case len(c.journalBy) == 1 && c.journalBy[0] == "WithJournalDir" && c.journalDir == "":
		return bad("empty journal directory; leave WithJournalDir out for the default directory")
	case c.journalDir != "" && !filepath.IsAbs(c.journalDir):
		return bad("journal directory %q is not an absolute path", c.journalDir)
	case c.maxBuffered < 0:
		return bad("body buffer limit %d, want >= 0", c.maxBuffered)
	case c.maxShared < 0:
		return bad("shared response limit %d, want >= 0", c.maxShared)
	case c.settle < 0:
		return bad("settle time %v, want >= 0", c.settle)
	case c.journalTimeout <= 0:
		return bad("journal timeout %v, want > 0", c.journalTimeout)
	case c.duplicateWindow < 0 || c.duplicateWindow >= c.keyWindow:
		return bad("duplicate window %v, want 0 (off) up to the key window %v", c.duplicateWindow, c.keyWindow)
	}
	return c.makeKeyed(bad)
}

// makeKeyed checks the names WithKeyedMethods and WithUnkeyedMethods gave,
// and makes the set of keyed methods from them.
func (c *config) makeKeyed(bad func(string, ...any) error) error {
	unkeyed := make(map[string]bool, len(c.unkeyed))
	for _, m := range c.unkeyed {
		if !validMethod(m) {
			return bad("unkeyed method %q, want an HTTP method in upper case, as sent", m)
		}
		unkeyed[m] = true
	}
	c.keyed = make(map[string]bool, len(defaultKeyedMethods)+len(c.addKeyed))
	for _, m := range defaultKeyedMethods {
		if !unkeyed[m] {
			c.keyed[m] = true
		}
	}
	for _, m := range c.addKeyed {
		switch {
		case !validMethod(m):
			return bad("keyed method %q, want an HTTP method in upper case, as sent", m)
		case unkeyed[m]:
			return bad("method %s both keyed (WithKeyedMethods) and unkeyed (WithUnkeyedMethods)", m)
		}
		c.keyed[m] = true
	}
	return nil
}

// isNil reports whether j is nil, or an interface holding a nil pointer,
// map, channel, function or slice (a *filejournal.Journal never opened).
func isNil(j journal.Journal) bool {
	if j == nil {
		return true
	}
	switch v := reflect.ValueOf(j); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.Slice:
		return v.IsNil()
	}
	return false
}
