package idemretry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	root "github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/internal/httptoken"
	"github.com/idemretry/idemretry/journal"
)

// Defaults of Options.
const (
	// DefaultTimeoutMillis bounds a Send, retries included, when neither
	// the Request nor the Options say otherwise: one minute.
	DefaultTimeoutMillis int64 = 60_000
	// DefaultKeyWindowMillis is how long an action's key may be sent after
	// it was made: 24 hours, as long as Stripe keeps a key.
	DefaultKeyWindowMillis = int64(root.DefaultKeyWindow / time.Millisecond)
)

// journalCallTimeout bounds Unfinished, Forget and Sync.
const journalCallTimeout = 10 * time.Second

// Options configure a Client. Null, or a field left at 0, means the
// default.
type Options struct {
	// KeyWindowMillis is how long an action's key may be sent after it
	// was made (default DefaultKeyWindowMillis): set it to how long your
	// server keeps idempotency keys, or less. After it, the action fails
	// with KindWindowExpired instead of being sent.
	KeyWindowMillis int64
	// TimeoutMillis bounds each Send, retries included, unless the Request
	// sets its own (default DefaultTimeoutMillis).
	TimeoutMillis int64
}

// NewOptions returns the default options.
func NewOptions() *Options {
	return &Options{KeyWindowMillis: DefaultKeyWindowMillis, TimeoutMillis: DefaultTimeoutMillis}
}

// Client sends requests that are safe to send again: each action's
// Idempotency-Key is on disk before its first attempt leaves the device,
// and every attempt, retry and resend after a restart carries it. Retries
// (network errors, 409, 429 and 5xx, with full-jitter backoff) happen
// inside Send. A Client is safe to use from several threads at once; two
// Sends of one action at the same time share one request. Only one Client
// (in any process) may hold a journal directory at a time.
type Client struct {
	transport *root.Transport
	http      *http.Client
	timeout   time.Duration
	window    time.Duration

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	busy    sync.WaitGroup // Sends and journal calls in progress
	sending map[string]int // named actions being sent or resumed: Forget refuses them
}

// NewClient opens a Client whose journal is in dir, an absolute path to a
// directory that the Client owns (it is created if missing, and its
// permissions are narrowed to the app's user): for example
// File(context.noBackupFilesDir, "idemretry") on Android, as the README
// shows, or a directory "idemretry" in Application Support on iOS. Keep
// dir across app updates, and never move it between versions: it holds
// the keys of unfinished payments, and a Client opened on another
// directory does not find them. It also holds fingerprint.key, the secret
// that checks a payment's resend (a body of 512 bytes or more): back it up
// together with the journal, or exclude both (noBackupFilesDir does on
// Android; isExcludedFromBackup on iOS). opts may be null.
//
// It fails with KindJournal if another Client, in this process or another
// one, holds dir (Close the first), or if the journal cannot be read;
// with KindInvalidRequest for a relative dir or a negative option.
func NewClient(dir string, opts *Options) (*Client, error) {
	if opts == nil {
		opts = NewOptions()
	}
	switch {
	case dir == "":
		return nil, newFailure(KindInvalidRequest, root.ErrInvalidOption, "invalid option: empty journal directory")
	case !filepath.IsAbs(dir):
		return nil, newFailure(KindInvalidRequest, root.ErrInvalidOption, "invalid option: journal directory "+quote(dir)+" is not an absolute path")
	case opts.KeyWindowMillis < 0:
		return nil, newFailure(KindInvalidRequest, root.ErrInvalidOption, "invalid option: negative KeyWindowMillis")
	case opts.TimeoutMillis < 0:
		return nil, newFailure(KindInvalidRequest, root.ErrInvalidOption, "invalid option: negative TimeoutMillis")
	}
	window := root.DefaultKeyWindow
	if opts.KeyWindowMillis > 0 {
		window = millis(opts.KeyWindowMillis)
	}
	timeout := time.Duration(DefaultTimeoutMillis) * time.Millisecond
	if opts.TimeoutMillis > 0 {
		timeout = millis(opts.TimeoutMillis)
	}
	t, err := root.NewTransport(newBase(),
		root.WithJournalDir(dir),
		root.WithKeyWindow(window),
		root.WithRequireAction(),
	)
	if err != nil {
		kind, msg := KindJournal, err.Error()
		switch {
		case errors.Is(err, root.ErrInvalidOption):
			kind = KindInvalidRequest
		case errors.Is(err, filejournal.ErrLocked):
			// The journal's message tells a Go program to wait with
			// filejournal.WithLockWait.
			msg = "journal locked: " + dir + " is held by another Client, in this process or another: Close it first, or use another directory"
		}
		return nil, newFailure(kind, err, msg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		transport: t,
		http:      &http.Client{Transport: t, CheckRedirect: checkRedirect},
		timeout:   timeout,
		window:    window,
		ctx:       ctx,
		cancel:    cancel,
	}, nil
}

// millis converts a positive count of milliseconds to a Duration,
// saturating.
func millis(ms int64) time.Duration {
	const most = int64(1<<63-1) / int64(time.Millisecond)
	if ms > most {
		ms = most
	}
	return time.Duration(ms) * time.Millisecond
}

// begin registers a call in progress, or fails if the Client is closed.
func (c *Client) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return newFailure(KindClosed, journal.ErrClosed, "client closed")
	}
	c.busy.Add(1)
	return nil
}

// Send sends req and returns the server's final answer: a 2xx, or a status
// that retrying cannot change (4xx other than 409 and 429, 501, 505). On
// the way it retries what may heal, always with the action's key. It
// returns an error, never with a Response, when no final answer came: test
// it with ErrorKind. With KindMaybeProcessed or KindGaveUp the server may
// have performed the action: send it again with the same ActionID (now,
// later, or through Resume on the next start) and never as a new action.
func (c *Client) Send(req *Request) (*Response, error) {
	if err := c.begin(); err != nil {
		var f *failure
		errors.As(err, &f)
		return nil, c.refused(f, req)
	}
	defer c.busy.Done()
	return c.send(req)
}

// refused completes f, a refusal of req before anything of it was sent:
// its action, and whether an earlier send of that action may have reached
// the server (the journal holds it, or cannot say).
func (c *Client) refused(f *failure, req *Request) *failure {
	if req == nil {
		return f
	}
	if f.f.ActionID == "" {
		f.f.ActionID = req.ActionID
	}
	if !strings.EqualFold(req.Method, http.MethodPost) && !strings.EqualFold(req.Method, http.MethodPatch) {
		return f
	}
	ids := make([]string, 0, 2)
	if req.ActionID != "" {
		ids = append(ids, req.ActionID)
	}
	if key, ok := ownKey(req.Headers); ok {
		ids = append(ids, keyActionPrefix+key)
	}
	ctx, cancel := context.WithTimeout(c.ctx, journalCallTimeout)
	defer cancel()
	for _, id := range ids {
		if held := c.held(ctx, id); held.maybe {
			f.f.MaybeProcessed = true
			if f.f.Key == "" {
				f.f.Key, f.f.Attempts = held.key, held.attempts
			}
		}
	}
	return f
}

func (c *Client) send(req *Request) (*Response, error) {
	hreq, cancel, ferr := c.prepare(req)
	if ferr != nil {
		return nil, c.refused(ferr, req)
	}
	defer cancel()
	id := keyedAction(hreq, req)
	defer c.mark(id)()
	held := c.held(hreq.Context(), id)
	tr := &sendTrace{}
	hreq = hreq.WithContext(context.WithValue(hreq.Context(), sendTraceKey{}, tr))
	resp, err := c.http.Do(hreq)
	if err != nil {
		f := classify(err, req.ActionID)
		tr.explain(f)
		if (f.f.Kind == KindJournal || f.f.Kind == KindOther || f.f.Kind == KindInvalidRequest || f.f.Kind == KindClosed) && held.maybe && !f.f.MaybeProcessed {
			// Refused before sending (a journal that failed, say), but
			// the action was in the journal, or the journal could not
			// say: an earlier send may have reached the server.
			f.f.MaybeProcessed = true
			if f.f.Key == "" {
				f.f.Key, f.f.Attempts = held.key, held.attempts
			}
		}
		c.count(f, id, tr)
		return nil, f
	}
	defer resp.Body.Close()
	o := root.OutcomeOf(resp, nil)
	if o.Kind != root.Done {
		// The retries stopped at this answer (root.GiveUpReason).
		msg := "gave up: " + trimPrefix(o.Reason.Error()) + ", last status " + strconv.Itoa(resp.StatusCode)
		if req.ActionID != "" {
			msg = "action " + quote(req.ActionID) + ": " + msg
		}
		f := newFailure(KindGaveUp, o.Reason, msg)
		f.f.ActionID, f.f.Status, f.f.MaybeProcessed = req.ActionID, clampInt32(resp.StatusCode), true
		f.f.Key, f.f.Attempts = o.Key, clampInt32(o.Attempts)
		tr.explain(f)
		c.count(f, id, tr)
		return nil, f
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		// The final answer came and is recorded; its body did not. A
		// resend with the same action id gets the server's replay.
		msg := "reading the response body: " + trimPrefix(err.Error())
		if req.ActionID != "" {
			msg = "action " + quote(req.ActionID) + ": " + msg
		}
		f := newFailure(KindMaybeProcessed, err, msg)
		f.f.ActionID, f.f.Status, f.f.MaybeProcessed = req.ActionID, clampInt32(resp.StatusCode), true
		f.f.Key = o.Key
		tr.explain(f)
		c.count(f, id, tr)
		return nil, f
	}
	return &Response{
		Status:   clampInt32(resp.StatusCode),
		Headers:  headersFrom(resp.Header),
		Body:     body,
		Replayed: root.IsReplay(resp),
	}, nil
}

// sendTrace is what one Send learns on the way, through its request's
// context: how many requests it handed to net/http (attempts and redirect
// hops: see countingBase), and the redirect, if any, that the server
// answered its keyed request (POST or PATCH) with, which http.Client
// follows.
type sendTrace struct {
	written atomic.Int32

	mu     sync.Mutex
	status int    // the redirect's status, or 0
	key    string // the key of the request it answered
}

type sendTraceKey struct{}

// countingBase is the Transport's base: net/http's Transport, counting in
// each Send's sendTrace the requests handed to it.
type countingBase struct{ base http.RoundTripper }

func (b countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if tr, ok := req.Context().Value(sendTraceKey{}).(*sendTrace); ok {
		tr.written.Add(1)
	}
	return b.base.RoundTrip(req)
}

// CloseIdleConnections closes the base's idle connections (Transport.Close
// calls it).
func (b countingBase) CloseIdleConnections() {
	if c, ok := b.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// newBase returns the Transport's base: a clone of http.DefaultTransport
// (so that Close affects no one else), counting.
func newBase() countingBase {
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		return countingBase{dt.Clone()}
	}
	return countingBase{http.DefaultTransport}
}

// count completes the Attempts of f, a Send's failure, with what is known
// of the requests sent for its action: for a keyed action (id), the
// journal's count, of every run, when the journal holds the action under
// f's key (its Key, if f has none); for another request, at least those
// this Send handed to net/http.
func (c *Client) count(f *failure, id string, tr *sendTrace) {
	if id == "" {
		f.f.Attempts = max(f.f.Attempts, tr.written.Load())
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, journalCallTimeout)
	defer cancel()
	h := c.held(ctx, id)
	if h.key == "" || (f.f.Key != "" && f.f.Key != h.key) {
		return
	}
	f.f.Key, f.f.Attempts = h.key, max(f.f.Attempts, h.attempts)
}

// maxRedirects is http.Client's default limit.
const maxRedirects = 10

// checkRedirect is http.Client's default policy (at most maxRedirects),
// and notes a redirect answered to a keyed request in the Send's
// sendTrace.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if r := req.Response; r != nil && r.Request != nil && (r.Request.Method == http.MethodPost || r.Request.Method == http.MethodPatch) {
		if tr, ok := req.Context().Value(sendTraceKey{}).(*sendTrace); ok {
			tr.mu.Lock()
			if tr.status == 0 {
				tr.status, tr.key = r.StatusCode, bareKey(r.Request.Header.Get(root.DefaultKeyHeader)) // bare, as every Failure's key
			}
			tr.mu.Unlock()
		}
	}
	if len(via) >= maxRedirects {
		return errors.New("stopped after " + strconv.Itoa(maxRedirects) + " redirects")
	}
	return nil
}

// explain completes f, the failure of a Send, when the server answered
// its keyed request with a redirect and what followed failed: the server
// has acted on the request (a 303 after a charge, say), so the failure is
// KindMaybeProcessed, whatever became of the redirect's target. Its key,
// status and attempts are the keyed request's, not the redirect target's.
func (tr *sendTrace) explain(f *failure) {
	tr.mu.Lock()
	status, key := tr.status, tr.key
	tr.mu.Unlock()
	if status == 0 {
		return
	}
	switch f.f.Kind {
	case KindNetwork, KindOther, KindInvalidRequest:
		f.f.Kind = KindMaybeProcessed
	}
	head := "answered " + strconv.Itoa(status) + ", then following the redirect: "
	if f.f.ActionID != "" {
		head = "action " + quote(f.f.ActionID) + ": " + head
	}
	f.f.Message = message(head + trimPrefix(f.f.Message))
	f.f.MaybeProcessed, f.f.Key = true, key
	f.f.Attempts = 1 // at least the one answered; count finds the rest
	if f.f.Status == 0 {
		f.f.Status = clampInt32(status)
	}
}

// heldAction is what the journal held of an action before a Send.
type heldAction struct {
	maybe    bool // the journal held it, or could not say
	key      string
	attempts int32
}

// keyedAction returns the journal's id of hreq's action if it is keyed
// (POST or PATCH) and named (req's ActionID, or "key:" and its own
// Idempotency-Key), else "".
func keyedAction(hreq *http.Request, req *Request) string {
	if hreq.Method != http.MethodPost && hreq.Method != http.MethodPatch {
		return ""
	}
	if key, ok := ownKey(req.Headers); ok {
		return keyActionPrefix + key
	}
	return req.ActionID
}

// mark registers id (if not "") as being sent or resumed until the
// function it returns is called: Forget refuses it meanwhile.
func (c *Client) mark(id string) func() {
	if id == "" {
		return func() {}
	}
	c.mu.Lock()
	if c.sending == nil {
		c.sending = map[string]int{}
	}
	c.sending[id]++
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		if c.sending[id]--; c.sending[id] == 0 {
			delete(c.sending, id)
		}
		c.mu.Unlock()
	}
}

// held reads the journal's record of action id (if not ""), before it is
// sent: an error that comes before sending then says whether an earlier
// send may have reached the server.
func (c *Client) held(ctx context.Context, id string) heldAction {
	if id == "" {
		return heldAction{}
	}
	g, ok := c.transport.Journal().(journal.Getter)
	if !ok {
		return heldAction{maybe: true}
	}
	rec, found, err := g.Get(ctx, id)
	switch {
	case err != nil:
		return heldAction{maybe: true}
	case !found:
		return heldAction{}
	}
	return heldAction{maybe: true, key: rec.Key, attempts: clampInt32(rec.Attempts)}
}

// prepare checks req and builds its http.Request, bounded by its timeout
// and the Client's life.
func (c *Client) prepare(req *Request) (*http.Request, context.CancelFunc, *failure) {
	if req == nil {
		return nil, nil, invalid("null request")
	}
	if !httptoken.Valid(req.Method) {
		return nil, nil, invalid("method " + quote(req.Method) + " is not an HTTP token")
	}
	method := req.Method
	for _, m := range standardMethods {
		// "post" is POST: sent as written, it would go without a key.
		if strings.EqualFold(method, m) {
			method = m
		}
	}
	u, err := url.Parse(req.URL)
	switch {
	case err != nil:
		return nil, nil, invalid("URL " + quote(req.URL) + " does not parse")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, nil, invalid("URL " + quote(req.URL) + " is not http or https")
	case u.Hostname() == "":
		// ":443" alone would dial this device.
		return nil, nil, invalid("URL " + quote(req.URL) + " has no host")
	case !validPort(u.Port()):
		return nil, nil, invalid("URL " + quote(req.URL) + " has a port outside 1-65535")
	case req.TimeoutMillis < 0:
		return nil, nil, invalid("negative TimeoutMillis")
	}
	if msg := req.Headers.check(); msg != "" {
		return nil, nil, invalid(msg)
	}
	keyed := method == http.MethodPost || method == http.MethodPatch
	if keyed && req.ActionID == "" && !req.Headers.Has(root.DefaultKeyHeader) {
		// The Transport refuses it too (WithRequireAction), in Go's words.
		return nil, nil, newFailure(KindInvalidRequest, root.ErrActionRequired, "request names no action: "+
			method+" "+u.Redacted()+" has neither an ActionID nor an "+root.DefaultKeyHeader+" header")
	}
	if req.ActionID != "" && req.Headers.Has(root.DefaultKeyHeader) {
		// The header would name the action and the ActionID be ignored:
		// a resend of the ActionID's action under another key, a second
		// payment.
		return nil, nil, invalid("both an ActionID (" + quote(req.ActionID) + ") and an " + root.DefaultKeyHeader + " header: name the action one way")
	}
	timeout := c.timeout
	if req.TimeoutMillis > 0 {
		timeout = millis(req.TimeoutMillis)
	}
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	if req.ActionID != "" {
		ctx = root.WithAction(ctx, req.ActionID)
	}
	// A private copy of the body: the app may reuse its array.
	var body io.Reader = http.NoBody
	if len(req.Body) > 0 {
		body = bytes.NewReader(bytes.Clone(req.Body))
	}
	hreq, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		cancel()
		return nil, nil, invalid(err.Error())
	}
	hreq.Header = req.Headers.toHTTP()
	return hreq, cancel, nil
}

// validPort reports whether port, a URL's digits after the host's colon
// (url.Parse took them as digits), is none or 1 to 65535.
func validPort(port string) bool {
	if port == "" {
		return true
	}
	n, err := strconv.ParseUint(port, 10, 16)
	return err == nil && n > 0
}

// standardMethods are the methods of RFC 9110 (and PATCH), which Send
// spells in upper case however the app spells them.
var standardMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}

// Forget removes actionID from the journal, once the app has learned from
// the server what became of it (an action that failed with
// KindWindowExpired, say). The next Send of actionID is a new action with
// a new key. Forgetting an action the journal does not hold is not an
// error. An action that a Send or Resume of this Client is sending is
// refused with KindInvalidRequest, nothing changed: a server that has no
// charge for it yet may be making it. After a Send ended with
// KindMaybeProcessed, leave the server time to finish what it received
// before taking its "no charge" for an answer.
func (c *Client) Forget(actionID string) error {
	if actionID == "" {
		return invalid("empty action id")
	}
	if err := c.begin(); err != nil {
		return err
	}
	defer c.busy.Done()
	c.mu.Lock()
	sending := c.sending[actionID] > 0
	c.mu.Unlock()
	if sending {
		// Forgotten now, its next send would get a new key while this
		// one may be charging under the old.
		f := invalid("action " + quote(actionID) + " is being sent or resumed: Forget it once that has returned")
		f.f.ActionID = actionID
		return f
	}
	ctx, cancel := context.WithTimeout(c.ctx, journalCallTimeout)
	defer cancel()
	if err := c.transport.Journal().Forget(ctx, actionID); err != nil {
		return journalFailure(err, "forget "+quote(actionID))
	}
	return nil
}

// Sync writes to disk every answer the journal has recorded: call it when
// the app goes to the background (onStop on Android,
// applicationDidEnterBackground or a scenePhase of .background on iOS),
// where the system may kill the app without warning. Keys are always on
// disk before their first send; what Sync adds is the "done" of actions
// answered in the last second, which, if lost, makes the next Resume send
// them once more (the server then replays its answer, so nothing is
// charged twice, but the app sees the action as unfinished).
func (c *Client) Sync() error {
	if err := c.begin(); err != nil {
		return err
	}
	defer c.busy.Done()
	s, ok := c.transport.Journal().(journal.Syncer)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.ctx, journalCallTimeout)
	defer cancel()
	if err := s.Sync(ctx); err != nil {
		return journalFailure(err, "sync")
	}
	return nil
}

// Close ends the Sends in progress (an action cut short stays pending with
// its key, for Resume), writes what the journal holds to disk and releases
// the journal directory. Call it when the app exits for good; a closed
// Client fails every call with KindClosed. Closing twice is not an error.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.busy.Wait()
	if err := c.transport.Close(); err != nil {
		return journalFailure(err, "close")
	}
	return nil
}

// journalFailure classifies an error of a journal call, named what: the
// journals' own errors say "journal <what>" already, and it is said once.
func journalFailure(err error, what string) *failure {
	op := "journal " + what + ": "
	return newFailure(KindJournal, err, op+strings.TrimPrefix(trimPrefix(err.Error()), op))
}

func trimPrefix(s string) string { return strings.TrimPrefix(s, "idemretry: ") }
