package idemretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// trickle writes status and a long Content-Length, then one byte every
// step until the client goes away.
func trickle(w http.ResponseWriter, r *http.Request, status int, step time.Duration) {
	w.Header().Set("Content-Length", "100000")
	w.WriteHeader(status)
	for range 100000 {
		if _, err := io.WriteString(w, "x"); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(step):
		}
	}
}

// A custom policy reading a trickling 503 body in 1-byte reads, each well
// under DefaultMaxDrainTime: the total is bounded, the retry is answered.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PolicyManySmallReadsBounded).
func TestPolicyManySmallReadsBounded(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			trickle(w, r, http.StatusServiceUnavailable, 20*time.Millisecond)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}))
	defer srv.Close()
	var readErr atomic.Value
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			b := make([]byte, 1)
			for {
				if _, err := resp.Body.Read(b); err != nil {
					readErr.Store(err)
					break
				}
			}
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy), idemretry.WithBackOff(constant(time.Millisecond)))
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:trickle"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "paid", readAll(t, resp))
	require.Less(t, time.Since(start), 15*time.Second)
	require.NotNil(t, readErr.Load())
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// A policy reads the start of a 201, replaces resp.Body with one yielding
// the same bytes, and keeps the original for later; the body's rest comes
// after 3*DefaultMaxDrainTime and the caller reads slowly: nothing is cut.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PolicyReplacesAndKeepsBody).
func TestPolicyReplacesAndKeepsBody(t *testing.T) {
	const rest = 64 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(16+rest))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("h", 16))
		w.(http.Flusher).Flush()
		time.Sleep(3 * idemretry.DefaultMaxDrainTime)
		io.WriteString(w, strings.Repeat("r", rest))
	}))
	defer srv.Close()
	var kept io.ReadCloser
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil {
			head := make([]byte, 16)
			if _, err := io.ReadFull(resp.Body, head); err != nil {
				panic(err)
			}
			kept = resp.Body
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(strings.NewReader(string(head)), kept), kept}
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:replace"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 16+rest, readSlowly(t, resp.Body, 4<<10, 5*time.Millisecond))
}

// KeyReuseRejected peeks at a final 422's JSON body (not a reuse); the
// rest of the body comes after 3*DefaultMaxDrainTime and the caller reads
// it slowly: the final body must not be cut.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PeekThenSlowCallerRead).
func TestPeekThenSlowCallerRead(t *testing.T) {
	head := `{"error":{"type":"invalid_request","message":"` + strings.Repeat("a", 9<<10) + `"}}`
	const tail = 32 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(head)+tail))
		w.WriteHeader(http.StatusUnprocessableEntity)
		io.WriteString(w, head)
		w.(http.Flusher).Flush()
		time.Sleep(3 * idemretry.DefaultMaxDrainTime)
		io.WriteString(w, strings.Repeat(" ", tail))
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:peek"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Equal(t, len(head)+tail, readSlowly(t, resp.Body, 1<<10, 2*time.Millisecond))
}

// Deriving, cancelling and registering AfterFuncs on a response's request
// context concurrently with its Close (end racing stop), under -race.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2StopRacesEnd).
func TestAttemptContextStopRacesEnd(t *testing.T) {
	srv := newOpenBodyServer(t)
	tr := transportOver(t, journal.NewMemory())
	for round := range 40 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:stop-%d", round)), srv.URL, `{}`))
		require.NoError(t, err)
		ctx := resp.Request.Context()
		var wg sync.WaitGroup
		var ran, stopped atomic.Int32
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 100 {
					switch (g + i) % 3 {
					case 0:
						_, cancel := context.WithCancel(ctx)
						cancel()
					case 1:
						_, cancel := context.WithDeadline(ctx, time.Now().Add(time.Duration(i%3)*time.Microsecond))
						cancel()
					case 2:
						stop := context.AfterFunc(ctx, func() { ran.Add(1) })
						if i%2 == 0 && stop() {
							stopped.Add(1)
						}
					}
				}
			}()
		}
		if round%2 == 0 {
			runtime.Gosched()
		}
		resp.Body.Close()
		wg.Wait()
		require.ErrorIs(t, ctx.Err(), context.Canceled)
	}
}

// Contexts derived from a response's request context through a value of
// the caller's (context.WithValue, as loggers and tracers add) while the
// body is open: none should need a goroutine of the context package to
// watch the attempt (none did before 5b944f9, whose attempt context was a
// context.WithCancel, found through the value layer).
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2ValueWrappedDerivationsNeedNoGoroutine).
func TestAttemptContextValueWrappedDerivationsNeedNoGoroutine(t *testing.T) {
	srv := newOpenBodyServer(t)
	tr := transportOver(t, journal.NewMemory())
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:value-derive"), srv.URL, `{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	type logKey struct{}
	var cancels []context.CancelFunc
	for range 20 {
		ctx, cancel := context.WithTimeout(context.WithValue(resp.Request.Context(), logKey{}, "req-1"), time.Hour)
		_ = ctx
		cancels = append(cancels, cancel)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	n := strings.Count(goroutineStacks(), "created by context.(*cancelCtx).propagateCancel")
	require.Zero(t, n, "goroutines of the context package watching an open attempt's context")
}

// Printing the context of a returned response's request (a debug log of
// req.Context() in a base or a handler) must not print the request's
// headers: an Authorization header is a credential.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PrintedContextHoldsNoCredential).
func TestAttemptContextPrintedHoldsNoCredential(t *testing.T) {
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	req := post(t, idemretry.WithAction(context.Background(), "pay:print"), srv.URL, `{"amount":1}`)
	req.Header.Set("Authorization", "Bearer sk_live_SECRET")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	printed := fmt.Sprintf("%v", resp.Request.Context())
	require.NotContains(t, printed, "sk_live_SECRET", "fmt of the attempt's context: %.300s", printed)
}

// A give-up's context: Deadline, Value and GiveUpReason through contexts
// derived from it (WithoutCancel, WithDeadline, AfterFunc), and its end
// with the body's Close.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2GiveUpContextDerived).
func TestGiveUpContextDerived(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, strings.Repeat("x", 256<<10))
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(1), idemretry.WithBackOff(constant(time.Millisecond)))
	type k struct{}
	for _, withDeadline := range []bool{false, true} {
		ctx := context.WithValue(context.Background(), k{}, "v")
		dl := time.Now().Add(time.Hour)
		if withDeadline {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl)
			defer cancel()
		}
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, fmt.Sprintf("pay:giveup-%v", withDeadline)), srv.URL, `{}`))
		require.NoError(t, err)
		require.ErrorIs(t, idemretry.GiveUpReason(resp), idemretry.ErrAttemptsExhausted)
		rc := resp.Request.Context()
		d, ok := rc.Deadline()
		require.Equal(t, withDeadline, ok)
		if ok {
			require.WithinDuration(t, dl, d, time.Second)
		}
		require.Equal(t, "v", rc.Value(k{}))
		wc := context.WithoutCancel(rc)
		require.Equal(t, "v", wc.Value(k{}))
		dctx, dcancel := context.WithDeadline(rc, time.Now().Add(time.Hour))
		defer dcancel()
		ran := make(chan struct{})
		context.AfterFunc(rc, func() { close(ran) })
		_ = fmt.Sprint(rc)
		require.NoError(t, rc.Err())
		resp.Body.Close()
		for _, c := range []<-chan struct{}{dctx.Done(), ran} {
			select {
			case <-c:
			case <-time.After(10 * time.Second):
				t.Fatal("derived context did not end with the body's Close")
			}
		}
		require.True(t, errors.Is(context.Cause(dctx), context.Canceled))
		require.NoError(t, wc.Err())
	}
	tr.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// Printing a response's request context while another goroutine closes
// the body: under -race, fmt's reads of the attempt's fields race with
// end's writes.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2PrintedContextRacesClose).
func TestAttemptContextPrintedRacesClose(t *testing.T) {
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	for i := range 20 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:print-race-%d", i)), srv.URL, `{}`))
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = fmt.Sprintf("%v", resp.Request.Context()) }()
		resp.Body.Close()
		<-done
	}
}

// HTTP/2 under context.Background: open answers' contexts are watched by
// no goroutine of the context package, and contexts derived and cancelled
// while a body is open are freed.
//
// Found in review 2 of the attempt context (e5cb2d5; was TestRev2HTTP2OpenBodies).
func TestAttemptContextOfOpenBodiesOverHTTP2(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("y", 256<<10))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	hb := srv.Client().Transport.(*http.Transport).Clone()
	hb.ForceAttemptHTTP2 = true
	defer hb.CloseIdleConnections()
	tr, err := idemretry.NewTransport(hb, inMemory())
	require.NoError(t, err)
	defer tr.Close()
	var open []*http.Response
	for i := range 8 {
		resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), fmt.Sprintf("pay:h2open-%d", i)), srv.URL, `{}`))
		require.NoError(t, err)
		require.Equal(t, 2, resp.ProtoMajor)
		open = append(open, resp)
	}
	require.Zero(t, strings.Count(goroutineStacks(), "created by context.(*cancelCtx).propagateCancel"))
	const n = 1000
	var freed atomic.Int32
	for range n {
		ctx, cancel := context.WithCancel(open[0].Request.Context())
		runtime.SetFinalizer(ctx, func(any) { freed.Add(1) })
		cancel()
	}
	for i := 0; i < 50 && freed.Load() < n/2; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	require.GreaterOrEqual(t, int(freed.Load()), n/2)
	for _, resp := range open {
		require.Len(t, readAll(t, resp), 256<<10)
	}
	hb.CloseIdleConnections()
	checkNoPackageGoroutines(t)
}

// readSlowly reads body to its end, chunk bytes at a time with a pause
// after each, as a slow caller does, and returns how many bytes it read;
// any error but io.EOF fails t.
func readSlowly(t *testing.T, body io.Reader, chunk int, pause time.Duration) int {
	t.Helper()
	var got int
	buf := make([]byte, chunk)
	for {
		n, err := body.Read(buf)
		got += n
		if err == io.EOF {
			return got
		}
		require.NoError(t, err, "after %d bytes", got)
		time.Sleep(pause)
	}
}

// A custom policy reads the start of a 503 (Retry-After: 0) body, giving it
// back; the 503 is then discarded, and the 201 that follows, judged by a
// policy that takes 2x DefaultMaxDrainTime of its own, arrives whole.
//
// Found in the last review of the attempt context (813580d; was TestRevFinal503ReadByPolicyThenDiscardThenSlowJudged201).
func TestPolicyRead503ThenDiscardThenSlowJudged201(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "busy, try again later")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created-part-1|")
		w.(http.Flusher).Flush()
		time.Sleep(3 * idemretry.DefaultMaxDrainTime / 2)
		io.WriteString(w, "part-2")
	}))
	defer srv.Close()
	var peeked atomic.Value
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			buf := make([]byte, 4)
			k, rerr := io.ReadFull(resp.Body, buf)
			peeked.Store(string(buf[:k]))
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(buf[:k]), resp.Body), resp.Body}
			_ = rerr
		} else if resp != nil {
			time.Sleep(2 * idemretry.DefaultMaxDrainTime)
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rf-503"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "busy", peeked.Load())
	require.Equal(t, "created-part-1|part-2", readAll(t, resp))
	require.EqualValues(t, 2, n.Load())
}

// A policy that goes on reading a stalled 503 body after its budget is
// spent gets errors at once (no second wait), and the retry's 201 arrives
// whole.
//
// Found in the last review of the attempt context (813580d; was TestRevFinalPolicyReadsAfterBudgetSpent).
func TestPolicyReadsAfterDrainBudgetSpent(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var n atomic.Int32
	srv := httptest.NewServer(firstThenCreated(&n, "paid", func(w http.ResponseWriter, r *http.Request) {
		stallBody(w, r, http.StatusServiceUnavailable, "partial", release)
	}))
	defer srv.Close()
	var after atomic.Int64
	var errs atomic.Int32
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			io.ReadAll(resp.Body) // cut after the budget
			start := time.Now()
			for range 3 {
				if _, rerr := resp.Body.Read(make([]byte, 8)); rerr != nil {
					errs.Add(1)
				}
			}
			after.Store(int64(time.Since(start)))
			return true
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr := transportOver(t, journal.NewMemory(), idemretry.WithRetryPolicy(policy),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rf-after"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, "paid", readAll(t, resp))
	require.Less(t, time.Since(start), 10*time.Second)
	require.EqualValues(t, 3, errs.Load(), "reads after the cut must fail")
	require.Less(t, time.Duration(after.Load()), 5*time.Second, "reads after the cut must not wait again")
}

// A base whose body returns its last bytes together with io.EOF, read by
// a custom policy, and a 201 with no body (net/http's http.NoBody).
//
// Found in the last review of the attempt context (813580d; was TestRevFinalDataWithEOFAndNoBody).
func TestPolicyReadsDataWithEOFAndNoBody(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "again")
			return
		}
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	hb := &http.Transport{}
	defer hb.CloseIdleConnections()
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := hb.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			resp.Body = struct {
				io.Reader
				io.Closer
			}{&dataWithEOF{r: resp.Body}, resp.Body}
		}
		return resp, err
	})
	var got503 atomic.Value
	var sawNoBody atomic.Bool
	policy := func(ctx context.Context, resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
			b, rerr := io.ReadAll(resp.Body)
			require.NoError(t, rerr)
			got503.Store(string(b))
			resp.Body = io.NopCloser(bytes.NewReader(b))
		}
		if resp != nil && resp.StatusCode == http.StatusCreated {
			sawNoBody.Store(resp.Body == http.NoBody)
		}
		return idemretry.DefaultRetryPolicy(ctx, resp, err)
	}
	tr, err := idemretry.NewTransport(base, inMemory(), idemretry.WithRetryPolicy(policy),
		idemretry.WithBackOff(constant(time.Millisecond)), idemretry.WithMaxRetries(2))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:rf-nobody"), srv.URL, `{"amount":1}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "", readAll(t, resp))
	require.Equal(t, "again", got503.Load())
	require.True(t, sawNoBody.Load(), "the policy saw a wrapper where net/http gave http.NoBody")
}

// dataWithEOF returns all of r's bytes in its first Read, with io.EOF.
type dataWithEOF struct {
	r    io.Reader
	done bool
}

func (d *dataWithEOF) Read(p []byte) (int, error) {
	if d.done {
		return 0, io.EOF
	}
	d.done = true
	b, err := io.ReadAll(d.r)
	if err != nil {
		return 0, err
	}
	return copy(p, b), io.EOF
}
