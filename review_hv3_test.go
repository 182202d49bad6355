package idemretry_test

// Review hV3: README guarantee 5 ("No hopeless waits") and the RoundTrip
// doc's "Waits" paragraph, over real loopback HTTP and journals that hang.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// slowProgressJournal is a Memory journal whose Update of a pending record
// (the attempt count written before the first retry's wait) hangs until
// its context ends.
type slowProgressJournal struct {
	*journal.Memory
	progress atomic.Int32
}

func (j *slowProgressJournal) Update(ctx context.Context, rec journal.Record) error {
	if rec.State == journal.StatePending {
		j.progress.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	return j.Memory.Update(ctx, rec)
}

// README guarantee 5: "No wait starts that would end after the context's
// deadline ... RoundTrip returns at once instead." The wait before a retry
// is checked against the deadline when it is drawn, but the discarded
// answer's drain and the attempt count's journal write come between that
// check and the sleep: here the write takes the journal timeout (1 s), so
// the 3 s wait that fitted the 3.5 s left no longer fits, and must not
// start. Before the fix the sleep started anyway and RoundTrip returned
// only at the deadline, with context.DeadlineExceeded.
//
// Found in review hv3 (8c60b37; was TestHV3NoHopelessRetryWaitAfterASlowProgressWrite).
func TestNoHopelessRetryWaitAfterASlowProgressWrite(t *testing.T) {
	var hits atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	j := &slowProgressJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(time.Second),
		idemretry.WithBackOff(constant(3*time.Second)), idemretry.WithMaxRetries(3))
	ctx, cancel := context.WithTimeout(idemretry.WithAction(context.Background(), "pay:hv3-hopeless"), 3500*time.Millisecond)
	defer cancel()

	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	beforeDeadline := ctx.Err() == nil
	if err == nil {
		err = idemretry.GiveUpReason(resp)
		resp.Body.Close()
	}
	require.NotZero(t, j.progress.Load(), "the attempt count was not written: the test proves nothing")
	require.Equal(t, int32(1), hits.Load())
	require.ErrorIs(t, err, idemretry.ErrWaitExceedsDeadline,
		"a 3 s wait was started with less than 3 s left before the deadline (after the 1 s progress write): %v", err)
	require.True(t, beforeDeadline, "RoundTrip waited for the deadline instead of returning at once")
}

// drainOnClose is a base RoundTripper over a real *http.Transport
// whose response bodies drain what is left when closed, to keep the
// connection, as many middlewares do: its Close returns once the body
// ends or the request's context does.
type drainOnClose struct{ base http.RoundTripper }

func (d drainOnClose) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(r)
	if err == nil {
		resp.Body = &drainingBody{ReadCloser: resp.Body}
	}
	return resp, err
}

type drainingBody struct{ io.ReadCloser }

func (b *drainingBody) Close() error {
	_, _ = io.Copy(io.Discard, b.ReadCloser)
	return b.ReadCloser.Close()
}

// bodyResumer rebuilds every pending action as a POST of body to url, and
// resolves nothing.
type bodyResumer struct{ url, body string }

func (r bodyResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(context.Background(), http.MethodPost, r.url, strings.NewReader(r.body))
}

func (bodyResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// firstDropped is a server whose first request's connection is cut
// without an answer (the action is left pending), and which answers the
// others with h.
func firstDropped(t *testing.T, h http.HandlerFunc) string {
	var n atomic.Int32
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			hijackAndClose(w)
			return
		}
		h(w, r)
	}).URL
}

// streamForever answers status and then a body that never ends, until
// the request does.
func streamForever(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		chunk := []byte(strings.Repeat("x", 4096))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

// Resume's doc: "Each response's body is discarded as the Transport
// discards any (at most DefaultMaxDrain bytes read, for at most
// DefaultMaxDrainTime) and closed". Resume stopped its drain timer before
// closing the body, so a body whose Close waits for its end (a base that
// drains on Close, over a body that never ends) held Resume until its
// context ended: here never. The Transport's own discard closes the body
// within the timer, which cuts the attempt.
//
// Found in review hv3 (8c60b37; was TestHV3ResumeDrainBoundsTheBodysClose).
func TestResumeDrainBoundsTheBodysClose(t *testing.T) {
	url := firstDropped(t, streamForever(http.StatusCreated))
	j := journal.NewMemory()
	const body = `{"amount":7}`
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:hv3-resume-drain"), url, body))

	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := idemretry.NewTransport(drainOnClose{base}, idemretry.WithJournal(j))
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })

	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := resumeAsync(rctx, tr, bodyResumer{url: url, body: body}, 1)
	var got resumed
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		cancel() // let it go, so that the test ends
		<-done
		t.Fatalf("Resume still draining a discarded body 10 s on (DefaultMaxDrainTime %v)", idemretry.DefaultMaxDrainTime)
	}
	require.NoError(t, got.err)
	require.Len(t, got.res, 1)
	require.Equal(t, http.StatusCreated, got.res[0].Status)
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Empty(t, un, "the outcome is recorded whatever the body")
}

// README guarantee 5 holds for Resume too: Resume's context bounds the
// requests it sends ("ends when Resume's ctx does"), so its deadline is
// theirs, and no wait that would end after it starts. Resume gave the
// rebuilt request only its own context's deadline (none here), so a
// Retry-After of 3 s was waited for under a Resume with 1.5 s left, which
// ended it as a cancellation.
//
// Found in review hv3 (8c60b37; was TestHV3ResumeDeadlineStopsHopelessWaits).
func TestResumeDeadlineStopsHopelessWaits(t *testing.T) {
	var hits atomic.Int32
	url := firstDropped(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	j := journal.NewMemory()
	const body = `{"amount":8}`
	leftPending(t, j, post(t, idemretry.WithAction(context.Background(), "pay:hv3-resume-deadline"), url, body))

	tr := transportOver(t, j, idemretry.WithMaxRetries(3))
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res, err := tr.Resume(ctx, bodyResumer{url: url, body: body}, 1)
	beforeDeadline := ctx.Err() == nil
	require.Len(t, res, 1)
	require.Equal(t, int32(1), hits.Load())
	require.ErrorIs(t, res[0].Err, idemretry.ErrWaitExceedsDeadline,
		"a Retry-After of 3 s was waited for with 1.5 s left of Resume's context: %v", res[0].Err)
	require.Equal(t, http.StatusServiceUnavailable, res[0].Status)
	require.True(t, beforeDeadline, "Resume waited for its deadline instead of returning at once")
	require.NoError(t, err)
}

// README guarantee 5: no wait starts that would end after "the key
// window". As with the deadline (above), the window was checked before the
// discarded answer's drain and the attempt count's journal write (here 2 s,
// the journal timeout): the 3 s wait that fitted the 4 s window when drawn
// no longer did, started all the same, and RoundTrip found the window over
// only when it ended, 5 s on.
//
// Found in review hv3 (8c60b37; was TestHV3NoRetryWaitPastTheKeyWindowAfterASlowProgressWrite).
func TestKeyWindowNoRetryWaitPastItAfterASlowProgressWrite(t *testing.T) {
	var hits atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	j := &slowProgressJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithJournalTimeout(2*time.Second), idemretry.WithKeyWindow(4*time.Second),
		idemretry.WithBackOff(constant(3*time.Second)), idemretry.WithMaxRetries(3))
	start := time.Now()
	err := sendErr(tr, post(t, idemretry.WithAction(context.Background(), "pay:hv3-window"), srv.URL, `{"amount":2}`))
	took := time.Since(start)
	require.NotZero(t, j.progress.Load(), "the attempt count was not written: the test proves nothing")
	require.Equal(t, int32(1), hits.Load())
	require.ErrorIs(t, err, idemretry.ErrKeyWindowExpired)
	require.Less(t, took, 4*time.Second, "a wait past the key window's end was started: RoundTrip returned %v on, the window being 4 s", took)
}

// noDoneUntil reports a deadline and has no Done channel, as a broken
// context does: the Transport's own waits end at its deadline all the
// same (README guarantee 5: the journal calls; the lease's polls), as they
// cannot be told through Done.
type noDoneUntil struct {
	context.Context
	dl time.Time
}

func (c noDoneUntil) Deadline() (time.Time, bool) { return c.dl, true }
func (noDoneUntil) Done() <-chan struct{}         { return nil }

// A caller that joins an action's flight waits for its leader "bounded by
// its own context" (RoundTrip's doc). A context with a deadline and no
// Done channel did not bound it: the joiner, due back at 300 ms, waited
// the leader's 4 s attempt out (and got its answer), where the lease's
// polls and every journal call end at such a deadline.
//
// Found in review hv3 (8c60b37; was TestHV3JoinerWithADeadlineAndNoDoneEndsAtItsDeadline).
func TestFlightJoinerWithADeadlineAndNoDoneEndsAtItsDeadline(t *testing.T) {
	srv := newSlowPayServer(t, 4*time.Second)
	tr := transportOver(t, journal.NewMemory())
	lead := sendAsync(tr, post(t, idemretry.WithAction(context.Background(), "pay:hv3-nodone-join"), srv.URL, `{"amount":4}`))
	<-srv.arrived // the leader's attempt is on the wire
	ctx := idemretry.WithAction(noDoneUntil{Context: context.Background(), dl: time.Now().Add(300 * time.Millisecond)}, "pay:hv3-nodone-join")
	start := time.Now()
	err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":4}`))
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the joiner waited for the leader past its deadline (%v)", took)
	require.NoError(t, <-lead)
	require.Equal(t, 1, srv.chargeCount())
}

// The recheck before a retry's wait (above) leaves a context that ended
// during the attempt count's write to be reported as the caller's own end:
// the deadline passed, it was not a wait refused for it.
//
// Found in review hv3 (8c60b37; was TestHV3DeadlineDuringTheProgressWriteIsTheCallers).
func TestDeadlineDuringTheProgressWriteIsTheCallers(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	j := &slowProgressJournal{Memory: journal.NewMemory()}
	tr := transportOver(t, j, idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(3))
	for _, ctx := range []context.Context{
		idemretry.WithAction(context.Background(), "pay:hv3-progress-deadline"),
		idemretry.WithAction(context.Background(), "pay:hv3-progress-nodone"),
	} {
		dl := time.Now().Add(500 * time.Millisecond)
		var cancel context.CancelFunc = func() {}
		if id, _ := idemretry.ActionFromContext(ctx); strings.HasSuffix(id, "nodone") {
			ctx = noDoneUntil{Context: ctx, dl: dl}
		} else {
			ctx, cancel = context.WithDeadline(ctx, dl)
		}
		err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":9}`))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.False(t, errors.Is(err, idemretry.ErrWaitExceedsDeadline), "the caller's deadline passed during the write: %v", err)
	}
}

// DefaultMaxShareTime: the leader of a flight that callers joined reads
// the final answer's body for them for at most that long, even under
// contexts that never end; a body that stalls is cut, the leader gets what
// was read followed by the error, the joiner ErrResponseNotShared, and the
// outcome stays recorded. (No test held the leader to it.)
//
// Found in review hv3 (8c60b37; was TestHV3SharedCopyOfAStalledBodyIsCutAtMaxShareTime).
func TestFlightSharedCopyOfAStalledBodyIsCutAtMaxShareTime(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var n atomic.Int32
	arrived := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			close(arrived)
			time.Sleep(300 * time.Millisecond) // the joiner joins meanwhile
		}
		stallBody(w, r, http.StatusCreated, `{"charge":`, release)
	})
	j := journal.NewMemory()
	tr := transportOver(t, j)
	ctx := idemretry.WithAction(context.Background(), "pay:hv3-share-stall")
	type result struct {
		resp *http.Response
		err  error
		took time.Duration
	}
	leader := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":6}`))
		leader <- result{resp, err, time.Since(start)}
	}()
	<-arrived
	jerr := sendErr(tr, post(t, ctx, srv.URL, `{"amount":6}`))
	var got result
	select {
	case got = <-leader:
	case <-time.After(idemretry.DefaultMaxShareTime + 10*time.Second):
		t.Fatalf("the leader still reads the body for its joiner %v on", idemretry.DefaultMaxShareTime+10*time.Second)
	}
	require.NoError(t, got.err)
	_, rerr := io.ReadAll(got.resp.Body)
	got.resp.Body.Close()
	require.Error(t, rerr, "the stalled body was cut")
	require.Less(t, got.took, idemretry.DefaultMaxShareTime+3*time.Second)
	require.ErrorIs(t, jerr, idemretry.ErrResponseNotShared)
	rec, ok, err := j.Get(context.Background(), "pay:hv3-share-stall")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, journal.StateDone, rec.State)
	require.Equal(t, int32(1), n.Load())
}
