package idemretry

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// A flight is one action's attempts in progress in this process. The first
// RoundTrip of an action leads it; a request of the same action (the same
// action id, and so, for an unnamed request, the same method, URL and body)
// that arrives while the flight is in the air joins it: it sends nothing
// and gets its own copy of the flight's result, if the flight's action is
// one it would itself have reserved (lifecycle.go decides who joins, and
// what each gets). This is what makes a double tap one payment even when
// the app names no action.
type flight struct {
	fp journal.Fingerprint
	// done is closed when the result below is set. It is made (under
	// flights.mu) only when a caller joins, or for a flight that goes on
	// from a landed one (land): a flight nobody joins, the common case,
	// needs none. Once the flight has landed it no longer changes.
	done chan struct{}
	// act is the action the leader reserved, and trace its first
	// attempt's trace, kept here to need no allocation of their own.
	act   action
	trace attemptTrace

	// id is the action id the flight is in the map under; digest is its
	// digest form (journal.Digest), computed only when a request with an
	// id in digest form looks for it. Guarded by flights.mu.
	id, digest string

	// Guarded by flights.mu.
	joiners int32
	// asker is askerOf the leader's request: a joiner takes the flight's
	// result only if its own request asks as the same principal (see
	// askerOf). Set by whoever leads it (join, wait, heir). Guarded by
	// flights.mu until the flight lands.
	asker uint32
	key   string // once reserved, for joiners' errors
	// resolving: Resume holds the flight while the app resolves the
	// action (reconcile.go); whoever joins is refused at once.
	resolving bool

	// Set by the leader before done is closed, read by the joiners after.
	// reserved: the leader's first reservation found the action's record
	// (before any attempt), under key; doneAt is its creation time in Unix
	// nanoseconds if it was done, else 0 (see found: a time.Time would
	// take a flight to the 1024-byte size class). acting: the leader
	// reserved the action, act, and sent it.
	reserved bool
	acting   bool
	// hopTap: the record the leader's first reservation found was done
	// with a 307/308 whose hop was unfinished, which made it a tap of it
	// (repeatOf). Guarded by flights.mu until the flight lands.
	hopTap bool
	// again: the leader stopped before its joiners had the result, for a
	// reason of its own (handsOver): they go again, one of them leading;
	// bound: as requests of act, under its key. leaderless: nobody leads
	// the flight yet: it went on from a landed one (land); the next caller
	// to claim it leads it, the others stay joined (guarded by
	// flights.mu). (The flags sit together: a
	// flight is 912 bytes, in the heap's 1024-byte size class.)
	again, bound, leaderless bool
	// undecided: of the callers joined to the flight when it landed, how
	// many have not said yet what they do (decide, heir); next: the
	// flight those of them that go again went on in (heir). Guarded by
	// flights.mu.
	undecided int32
	next      *flight
	doneAt    int64
	body      []byte // the response's body, read for the joiners
	resp      *http.Response
	err       error
}

// flights are the actions in the air in one Transport.
//
// Two ids with the same digest (journal.Digest) are one action: a journal
// that hashes ids lists an action by its digest, and a Resume of it must
// share one flight with a live request of the same action. The flights are
// kept by id as given, and a digest is computed only to compare an id in
// digest form with the others: a live request pays for a digest only while
// a flight under a digest-form id is in the air.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
	// digests counts the flights in m under an id in digest form.
	digests int
}

// join returns the flight of action id, or starts one that the caller leads.
// A request whose fingerprint differs from the flight's cannot join it.
func (fs *flights) join(id string, fp journal.Fingerprint, asker uint32, claim bool) (f *flight, lead bool, mismatch bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f = fs.find(id); f != nil {
		if f.fp != fp {
			// The caller may wait for the flight to land all the same
			// (holdFlight, when a keyed fingerprint cannot be compared
			// here): it needs the channel that tells it so.
			if f.done == nil {
				f.done = make(chan struct{})
			}
			return f, false, true
		}
		if f.leaderless && claim {
			// Gone on from a landed flight, and nobody leads it yet
			// (land): the caller leads it, for the joiners counted in
			// it, and its answer is to the caller's principal (asker).
			f.leaderless, f.asker = false, asker
			return f, true, false
		}
		f.joiners++
		if f.done == nil {
			f.done = make(chan struct{})
		}
		return f, false, false
	}
	if fs.m == nil {
		fs.m = make(map[string]*flight)
	}
	f = &flight{fp: fp, id: id, asker: asker}
	if journal.IsDigest(id) {
		f.digest = id
		fs.digests++
	}
	fs.m[id] = f
	return f, true, false
}

// find returns the flight in the air of the action id, or nil: the one
// under id, or under another id with the same digest.
func (fs *flights) find(id string) *flight {
	if f := fs.m[id]; f != nil {
		return f
	}
	if !journal.IsDigest(id) {
		if fs.digests == 0 {
			return nil // no flight under a digest: no other id can match
		}
		return fs.m[journal.Digest(id)]
	}
	// id is a digest: the flight may be under the id it is the digest of.
	for _, f := range fs.m {
		if f.digest == "" {
			f.digest = journal.Digest(f.id)
		}
		if f.digest == id {
			return f
		}
	}
	return nil
}

// inAir reports whether a flight whose action id begins with prefix is
// in the air.
func (fs *flights) inAir(prefix string) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for id, f := range fs.m {
		if strings.HasPrefix(id, prefix) && !f.leaderless {
			return true // a flight nobody leads yet sends nothing
		}
	}
	return false
}

// unjoin takes one caller's join of f, in the air, back: f's leader makes
// no copy of the answer for it (see land), and so neither holds nor reads
// its own answer for one. The last joiner to go from a flight that nobody
// leads yet (one that went on from a landed flight: land) lands it: nobody
// is left to lead it, and a later request of the action starts anew.
// fs.mu is held.
func (fs *flights) unjoin(f *flight) {
	if f.joiners == 0 {
		return
	}
	f.joiners--
	if f.leaderless && f.joiners == 0 {
		fs.remove(f)
		f.leaderless, f.again = false, true
		close(f.done)
	}
}

// decide says that a caller joined to f goes no further with it, nor with
// the flight its other joiners went on in (heir): it took f's result,
// carries f's action on by itself, stopped waiting (its context ended), or
// never meant to take its answer (Resume waiting for it to land). f still
// in the air, its join is taken back (unjoin); f landed, it is counted out
// of the flights that went on from f, as one that would join them (heir).
func (fs *flights) decide(f *flight) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m[f.id] == f {
		fs.unjoin(f)
		return
	}
	fs.countOut(f)
}

// countOut takes one undecided joiner of f, landed, out of f's count and
// out of the flights that went on from it. fs.mu is held.
func (fs *flights) countOut(f *flight) {
	for {
		if fs.m[f.id] == f {
			fs.unjoin(f) // in the air: counted as one of its joiners
			return
		}
		if f.undecided == 0 {
			return
		}
		f.undecided--
		next := f.next
		if f.undecided == 0 {
			f.next = nil // every joiner has decided: nothing later is kept alive through f
		}
		f = next
		if f == nil {
			return
		}
	}
}

// heir returns the flight in which a caller joined to f, landed, goes
// again (landed's goAgain: f's action is not its own), and whether it
// leads it: the flight that went on from f (land), in which the caller
// was counted as joined; or nil, when none did (the caller boards again).
// The first of f's joiners to go again, or a request that arrived since f
// landed, leads it; the others are joined to it, however late they wake,
// and take its result, instead of finding its payment done and making
// another. A caller whose context has ended claims nothing: it stays
// joined, and its wait ends at once.
func (fs *flights) heir(ctx context.Context, f *flight, asker uint32) (g *flight, lead bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	g = f.next
	if f.undecided > 0 {
		if f.undecided--; f.undecided == 0 {
			f.next = nil
		}
	}
	if g != nil && fs.m[g.id] == g && g.leaderless && !callerEnded(ctx) {
		g.leaderless, g.asker = false, asker
		g.joiners--
		return g, true
	}
	return g, false
}

func (fs *flights) setKey(f *flight, key string) {
	fs.mu.Lock()
	f.key = key
	fs.mu.Unlock()
}

// noteFound records on f, once, what its first reservation found: rec,
// and whether it took rec, done, as unfinished for its hop (hopTap).
func (fs *flights) noteFound(f *flight, rec journal.Record, hopTap bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.reserved {
		return
	}
	f.key, f.reserved, f.hopTap = rec.Key, true, hopTap
	if rec.State == journal.StateDone {
		f.doneAt = rec.CreatedAt.UnixNano()
	}
}

// hopFound returns what f's first reservation found so far, for a request
// joining it: its key, and whether it took it as a tap for its unfinished
// hop (flight.hopTap), if it has reserved.
func (fs *flights) hopFound(f *flight) (key string, hopTap, reserved bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return f.key, f.hopTap, f.reserved
}

// found returns what f's first reservation found, as far as its joiners
// judge by it (landed): its key, and whether it was done, created when.
// f has landed.
func (f *flight) found() journal.Record {
	if f.doneAt == 0 {
		return journal.Record{Key: f.key, State: journal.StatePending}
	}
	return journal.Record{Key: f.key, State: journal.StateDone, CreatedAt: time.Unix(0, f.doneAt)}
}

// reconciling reports whether f is held by Resume while the app resolves
// its action.
func (fs *flights) reconciling(f *flight) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return f.resolving
}

// holdForResolve marks f, led by Resume, as held while its action, under
// key, is resolved.
func (fs *flights) holdForResolve(f *flight, key string) {
	fs.mu.Lock()
	f.key, f.resolving = key, true
	fs.mu.Unlock()
}

func (fs *flights) keyOf(f *flight) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return f.key
}

// land takes the flight of id out of the air, so that later requests start
// anew, and returns how many joined it. The leader calls it once its outcome
// is recorded in the journal: a request that arrives after that is a new
// action (or, for a named one, a resend that the journal answers).
func (fs *flights) land(f *flight) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.remove(f)
	if f.joiners > 0 && fs.m[f.id] == nil {
		// Its joiners that go again (heir), and requests that arrive
		// while they wake, are one tap: they go on in one flight, which
		// is in the air from now, counting each joiner as joined until it
		// decides (decide, heir), so that none finds another's payment
		// done. Nobody leads it until one of them, or a new request,
		// claims it; nobody going on in it, it lands (unjoin).
		g := &flight{fp: f.fp, id: f.id, digest: f.digest, joiners: f.joiners, leaderless: true, done: make(chan struct{})}
		if g.digest == g.id {
			fs.digests++
		}
		fs.m[f.id] = g
		f.next = g
	}
	f.undecided = f.joiners
	return int(f.joiners)
}

// remove takes f out of the map, if it is there. fs.mu is held.
func (fs *flights) remove(f *flight) {
	if fs.m[f.id] == f {
		delete(fs.m, f.id)
		if f.digest == f.id {
			fs.digests--
		}
	}
}

// fail ends the flight with err for its joiners. The flight has landed.
func (f *flight) fail(err error) {
	f.err = err
	f.release()
}

// release wakes the joiners, if any. The flight has landed, so no caller
// joins it any more.
func (f *flight) release() {
	if f.done != nil {
		close(f.done)
	}
}

// copyBody reads resp's body into memory for the joiners, up to maxShared
// bytes and for at most DefaultMaxShareTime (a bound of its own, within
// RoundTrip, even under a context that never ends), and keeps a snapshot
// of resp for them. It returns why the body could not be copied whole, or
// nil; resp stays the leader's to read either way: from memory, or, not
// copied, as read so far followed by the rest (or the read's error).
func (f *flight) copyBody(resp *http.Response, maxShared int64) error {
	var buf []byte
	if resp.Body != nil && resp.Body != http.NoBody {
		var cut *time.Timer
		if ab, ok := resp.Body.(*attemptBody); ok {
			cut = time.AfterFunc(DefaultMaxShareTime, (*attemptTrace)(ab).end)
		}
		var rerr error
		buf, rerr = io.ReadAll(io.LimitReader(resp.Body, addSize(maxShared, 1)))
		if cut != nil {
			cut.Stop()
		}
		if rerr != nil || int64(len(buf)) > maxShared {
			resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), errReader(rerr, resp.Body)), c: resp.Body}
			return errNotShared(rerr, maxShared)
		}
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(buf))
	}
	// The joiners copy a snapshot: the leader's caller owns resp from now
	// on (http.Client wraps its Body, callers set headers).
	snap := *resp
	snap.Header, snap.Trailer = resp.Header.Clone(), resp.Trailer.Clone()
	f.resp, f.body = &snap, buf
	return nil
}

// notShared is the joiners' error when resp, the flight's answer to
// action id, is not shared with them, for cause.
func (f *flight) notShared(id string, resp *http.Response, cause error) error {
	return &ActionError{Action: id, Key: f.act.rec.Key, Attempts: responseOutcome(resp).Attempts, Status: resp.StatusCode,
		MaybeProcessed: true, Reason: ErrResponseNotShared, Err: cause}
}

// result returns a joiner's copy of the flight's result.
func (f *flight) result() (*http.Response, error) {
	if f.err != nil || f.resp == nil {
		return nil, f.err
	}
	r := new(http.Response)
	*r = *f.resp
	r.Header = f.resp.Header.Clone()
	r.Trailer = f.resp.Trailer.Clone()
	switch f.resp.Body {
	case nil, http.NoBody:
		r.Body = f.resp.Body
	default:
		r.Body = io.NopCloser(bytes.NewReader(f.body))
		r.ContentLength = int64(len(f.body))
	}
	return r, nil
}

// wait waits, for a caller joined to f, until f lands, or for ctx (see
// waitFor).
func (fs *flights) wait(ctx context.Context, f *flight) error {
	fs.mu.Lock()
	done := f.done
	fs.mu.Unlock()
	return waitFor(ctx, done)
}

// landing returns the channel that is closed when f lands, for a caller
// that waits for it without joining it.
func (fs *flights) landing(f *flight) <-chan struct{} {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.done == nil {
		f.done = make(chan struct{})
	}
	return f.done
}

// waitFor waits for done to be closed, or for ctx. A done closed when ctx
// ends is taken: the answer is in hand. A ctx with a deadline and no Done
// channel ends the wait at its deadline: nothing else would.
func waitFor(ctx context.Context, done <-chan struct{}) error {
	var expired <-chan time.Time
	if ctx.Done() == nil {
		if dl, ok := ctx.Deadline(); ok {
			timer := time.NewTimer(time.Until(dl))
			defer timer.Stop()
			expired = timer.C
		}
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	case <-expired:
	}
	select {
	case <-done:
		return nil
	default:
		return callerErr(ctx)
	}
}

func errNotShared(cause error, limit int64) error {
	if cause != nil {
		return fmt.Errorf("reading the body: %w", cause)
	}
	return fmt.Errorf("body over %d bytes", limit)
}

// prefixedBody reads Reader and closes c.
type prefixedBody struct {
	io.Reader
	c io.Closer
}

func (p *prefixedBody) Close() error { return p.c.Close() }

// errReader continues with r, or fails with err if the read so far did.
func errReader(err error, r io.Reader) io.Reader {
	if err != nil {
		return &failReader{err}
	}
	return r
}

type failReader struct{ err error }

func (f *failReader) Read([]byte) (int, error) { return 0, f.err }

// askerHeaders are the request headers that say who is asking, and on
// whose behalf: the credentials of RFC 9110 (Authorization,
// Proxy-Authorization) and RFC 6265 (Cookie), the API-key headers of the
// SDKs tested (anthropic-sdk-go's X-Api-Key, Azure OpenAI's Api-Key), and
// the account and organisation those SDKs act for (stripe-go's
// Stripe-Account and Stripe-Context, openai-go's OpenAI-Organization and
// OpenAI-Project). A header named *-Token, *-Key or *-Secret says so too
// (askerSuffixes): Shopify's X-Shopify-Access-Token, GitLab's
// Private-Token, Google's X-Goog-Api-Key, Azure API Management's
// Ocp-Apim-Subscription-Key (not a key header: isAsker). One that is not
// a credential (a CSRF token) costs at most a request of its own, under
// the action's key (lifecycle.go's carryOn).
var askerHeaders = [...]string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key",
	"Stripe-Account", "Stripe-Context", "Openai-Organization", "Openai-Project"}

// askerSuffixes end the names of the other credential headers (see
// askerHeaders).
var askerSuffixes = [...]string{"-Token", "-Key", "-Secret"}

// askerSeed keys askerOf's hash: unknown outside this process, so that no
// request can be made to ask as another's principal by its hash.
var askerSeed = maphash.MakeSeed()

// isAsker reports whether the header k (any spelling) says who asks. The
// Transport's key header (keyHeader), and any *Idempotency-Key, say which
// action, not who asks: an SDK's own key differs per call.
func isAsker(k, keyHeader string) bool {
	for _, a := range askerHeaders {
		if len(k) == len(a) && strings.EqualFold(k, a) {
			return true
		}
	}
	const idem = "Idempotency-Key"
	if strings.EqualFold(k, keyHeader) || len(k) >= len(idem) && strings.EqualFold(k[len(k)-len(idem):], idem) {
		return false
	}
	for _, sfx := range askerSuffixes {
		if len(k) > len(sfx) && strings.EqualFold(k[len(k)-len(sfx):], sfx) {
			return true
		}
	}
	return false
}

// askerOf returns a hash of h's askerHeaders (any spelling, in any order;
// keyHeader is the Transport's: see isAsker), 0 for none. Two requests of one action whose hashes differ ask as two
// principals (two tenants' API keys, two connected accounts): neither may
// be given the answer to the other's request, however alike their method,
// URL and body.
func askerOf(h http.Header, keyHeader string) uint32 {
	var sum uint64
	for k, vv := range h {
		if !isAsker(k, keyHeader) {
			continue
		}
		var d maphash.Hash
		d.SetSeed(askerSeed)
		for i := 0; i < len(k); i++ { // the name, case-folded: any spelling
			c := k[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			d.WriteByte(c)
		}
		for _, v := range vv {
			d.WriteByte(0)
			d.WriteString(v)
		}
		sum += d.Sum64() // in any order
	}
	return uint32(sum ^ sum>>32)
}
