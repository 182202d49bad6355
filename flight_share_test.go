package idemretry_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Issue 26, item 3: the first caller of an unnamed payment has a 1 s
// deadline, a double tap 10 s. The server charges, sends the 201's headers
// at once and its body 300 ms after the first caller's deadline. The
// action is done; the first caller's context ends while its body is read
// for the joiner. The joiner, with 9 s left, must get the answer, not
// ErrResponseNotShared: for an unnamed payment it would be lost for good.
func TestFlightJoinerGetsTheAnswerThatOutlivesTheLeadersDeadline(t *testing.T) {
	t.Parallel()
	const body = `{"amount":5100}`
	srv := newPayServer(t)
	leaderCtx, cancelLeader := context.WithTimeout(context.Background(), time.Second)
	defer cancelLeader()
	deadline, _ := leaderCtx.Deadline()
	joined := make(chan struct{})
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			<-joined
		}
		return false // the idempotency layer charges the first, replays the rest
	}
	srv.afterCharge = func(n int, w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		time.Sleep(time.Until(deadline) + 300*time.Millisecond)
		io.WriteString(w, `{"charge":"ch_1"}`)
		return true
	}
	tr := transportOver(t, journal.NewMemory())
	leader := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(post(t, leaderCtx, srv.URL, body))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		leader <- err
	}()
	require.Eventually(t, func() bool { return len(srv.seen()) == 1 }, 10*time.Second, time.Millisecond)
	joinerCtx, cancelJoiner := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelJoiner()
	joiner := payAsync(tr, post(t, joinerCtx, srv.URL, body))
	awaitJoiners(t, tr, 1)
	close(joined)

	p := <-joiner
	require.NoError(t, p.err, "the joiner, with 9 s left, lost the answer to the first caller's deadline")
	assert.Equal(t, http.StatusCreated, p.status)
	assert.Equal(t, `{"charge":"ch_1"}`, p.body)
	assert.ErrorIs(t, <-leader, context.DeadlineExceeded, "the first caller's own deadline cut its read")
	assert.Equal(t, 1, srv.chargeCount())
	keys := keysOf(srv.seen())
	for _, k := range keys {
		assert.Equal(t, keys[0], k, "every request of the payment carries its key")
	}
}

// Issue 26, item 4: two callers of one action send a POST upgrade; the
// answer is a 101 Switching Protocols, whose body is the upgraded
// connection. It is never shared: the first caller gets the connection
// at once, writable, and the joiner ErrResponseNotShared with status 101;
// nothing copies the connection (it would hang past every deadline).
func TestFlightSwitchingProtocolsIsNeverShared(t *testing.T) {
	t.Parallel()
	joined, arrived := make(chan struct{}), make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		io.Copy(io.Discard, r.Body)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		<-joined
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		brw.WriteString("echo " + line)
		brw.Flush()
		brw.ReadString('\n') // held open until the caller closes it
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	upgrade := func(ctx context.Context) *http.Request {
		req := post(t, idemretry.WithAction(ctx, "pay:upgrade-shared"), srv.URL, "hello")
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		return req
	}
	leaderCtx, cancelLeader := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelLeader()
	type answer struct {
		resp *http.Response
		err  error
	}
	leader := make(chan answer, 1)
	go func() {
		resp, err := tr.RoundTrip(upgrade(leaderCtx))
		leader <- answer{resp, err}
	}()
	<-arrived
	joinerCtx, cancelJoiner := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelJoiner()
	joiner := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(upgrade(joinerCtx))
		if err == nil {
			resp.Body.Close()
			err = errors.New("the joiner was given a copy of an upgraded connection")
		}
		joiner <- err
	}()
	awaitJoiners(t, tr, 1)
	close(joined)

	var a answer
	select {
	case a = <-leader:
	case <-time.After(idemretry.DefaultMaxShareTime + 5*time.Second):
		t.Fatal("the first caller's RoundTrip is still copying the upgraded connection for its joiner")
	}
	require.NoError(t, a.err)
	require.Equal(t, http.StatusSwitchingProtocols, a.resp.StatusCode)
	rwc, ok := a.resp.Body.(io.ReadWriteCloser)
	require.True(t, ok, "the first caller's 101 body is the connection, got %T", a.resp.Body)
	defer rwc.Close()
	_, err := io.WriteString(rwc, "hi\n")
	require.NoError(t, err)
	got, err := bufio.NewReader(rwc).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "echo hi\n", got)

	err = <-joiner
	require.ErrorIs(t, err, idemretry.ErrResponseNotShared)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusSwitchingProtocols, ae.Status)
}

// A flight and the caller's cancel, through the deprecated (still
// honoured) Request.Cancel channel: the first caller cancels while its
// attempt is at the server; the double tap, with time to spare, must not
// be handed the first caller's cancellation (nor a give-up it caused): it
// is the first caller's own, as its context's end would be, and the tap
// carries the payment on under its key.
func TestFlightLeadersRequestCancelIsNotTheJoiners(t *testing.T) {
	t.Parallel()
	const body = `{"amount":5200}`
	srv := newPayServer(t)
	atServer, release := holdRequest(t, srv, 1)
	tr := transportOver(t, journal.NewMemory(), idemretry.WithBackOff(constant(time.Millisecond)))
	cancel := make(chan struct{})
	req := post(t, context.Background(), srv.URL, body)
	//lint:ignore SA1019 the deprecated channel is what is tested
	req.Cancel = cancel
	leader := payAsync(tr, req)
	<-atServer
	ctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	joiner := payAsync(tr, post(t, ctx, srv.URL, body))
	awaitJoiners(t, tr, 1)
	close(cancel)
	<-leader // cancelled; or, as net/http may still send a retry after the cancel (issue 26, item 5), answered
	release()

	p := <-joiner
	require.NoError(t, p.err, "the double tap was handed the first caller's cancellation")
	assert.Equal(t, http.StatusCreated, p.status)
	assert.Equal(t, 1, srv.chargeCount())
}

// A flight and a body over WithMaxSharedResponse: the joiner gets
// ErrResponseNotShared, whose ActionError says what an ActionError says
// of any action: its key and the attempts sent under it, in all runs
// recorded (here two: a 503, then the 201), as the journal records them.
func TestFlightNotSharedSaysTheActionsAttempts(t *testing.T) {
	t.Parallel()
	const body = `{"amount":5300}`
	big := strings.Repeat("z", 4096)
	srv := newPayServer(t)
	atServer, release := make(chan struct{}), make(chan struct{})
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n > 1 {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, big)
			return true
		}
		close(atServer)
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	}
	j := journal.NewMemory()
	tr := transportOver(t, j, idemretry.WithMaxSharedResponse(1024), idemretry.WithBackOff(constant(time.Millisecond)))
	ctx := idemretry.WithAction(context.Background(), "pay:not-shared-attempts")
	leader := payAsync(tr, post(t, ctx, srv.URL, body))
	<-atServer
	joiner := make(chan error, 1)
	go func() { joiner <- sendErr(tr, post(t, ctx, srv.URL, body)) }()
	awaitJoiners(t, tr, 1)
	close(release)

	l := <-leader
	require.NoError(t, l.err)
	require.Equal(t, big, l.body)
	err := <-joiner
	require.ErrorIs(t, err, idemretry.ErrResponseNotShared)
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	rec, found, gerr := j.Get(context.Background(), "pay:not-shared-attempts")
	require.NoError(t, gerr)
	require.True(t, found)
	assert.Equal(t, rec.Key, ae.Key)
	assert.Equal(t, 2, rec.Attempts, "the journal's count")
	assert.Equal(t, rec.Attempts, ae.Attempts, "the joiner's ActionError: %v", err)
}

// DefaultMaxShareTime: the leader of a flight that callers joined reads
// the final answer's body for them for at most that long, even under
// contexts that never end; a body that stalls is cut, the leader gets what
// was read followed by the error, the joiner ErrResponseNotShared, and the
// outcome stays recorded. (No test held the leader to it.)
//
// Found in review hv3 (8c60b37; was TestHV3SharedCopyOfAStalledBodyIsCutAtMaxShareTime).
func TestFlightSharedCopyOfAStalledBodyIsCutAtMaxShareTime(t *testing.T) {
	t.Parallel()
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

// A caller that joined a flight and stopped waiting (its context ended,
// or its Request.Cancel was closed before it even arrived) takes no copy
// of the answer, so the leader makes none for it: the leader's answer, a
// 201 that streams (an SDK's streamed completion, a long receipt), is
// handed to it at once and read whole. Before: the caller that left still
// counted, and the leader's RoundTrip read the body for it until
// DefaultMaxShareTime (5 s) cut it: the leader got the first chunk, then
// context.Canceled.
func TestFlightJoinerThatLeftIsNotCopiedFor(t *testing.T) {
	for _, how := range []string{"context cancelled", "Request.Cancel closed before it arrived"} {
		t.Run(how, func(t *testing.T) {
			left := make(chan struct{})     // the joiner has stopped waiting
			returned := make(chan struct{}) // the leader's RoundTrip has returned
			srv := newPayServer(t)
			srv.arrived = make(chan int, 10)
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				<-left
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "data: 1\n")
				w.(http.Flusher).Flush()
				select { // the rest once the leader has its answer in hand
				case <-returned:
				case <-r.Context().Done():
					return true
				case <-time.After(liveness):
				}
				io.WriteString(w, "data: 2\n")
				return true
			}
			tr, _, _ := newTestTransport(t) // checks at cleanup that no goroutine of the package is left
			ctx := idemretry.WithAction(context.Background(), "chat:stream-1")
			const body = `{"prompt":"hello"}`
			leader := make(chan rtResult, 1)
			go func() {
				resp, err := tr.RoundTrip(post(t, ctx, srv.URL, body))
				close(returned)
				leader <- rtResult{resp, err}
			}()
			<-srv.arrived

			var err error
			if how == "context cancelled" {
				jctx, cancel := context.WithCancel(ctx)
				joiner := goRoundTrip(tr, post(t, jctx, srv.URL, body))
				awaitJoiners(t, tr, 1)
				cancel()
				err = awaitResult(t, joiner, "a joiner").err
			} else {
				req, cancel := postCancel(t, ctx, srv.URL, body)
				cancel()
				_, err = tr.RoundTrip(req)
			}
			close(left)
			require.ErrorIs(t, err, context.Canceled, "the caller that left")
			var ae *idemretry.ActionError
			require.ErrorAs(t, err, &ae, "it had joined the flight")

			l := awaitResult(t, leader, "the leader")
			require.NoError(t, l.err)
			require.Equal(t, http.StatusCreated, l.resp.StatusCode)
			require.Equal(t, "data: 1\ndata: 2\n", readAll(t, l.resp), "the leader's streamed answer, whole")
			require.Len(t, srv.seen(), 1)
		})
	}
}

// A request that joins a flight takes its answer only if it asks as the
// flight's leader does: an identical unnamed POST with another
// Authorization (another tenant's API key, or a token refreshed between
// two taps) goes, once the flight has landed, under the action's key with
// its own credentials, and the server judges it (this one replays); with
// the same Authorization it is a double tap, and takes the copy. (Issue 29:
// another tenant's request was handed the leader's answer, sending nothing.)
//
// A credential header outside the SDKs' names (Shopify's
// X-Shopify-Access-Token, GitLab's Private-Token, Google's X-Goog-Api-Key)
// says who asks as well: a header named *-Token, *-Key or *-Secret does.
// (Before, two tenants' identical requests with their own
// X-Shopify-Access-Token were one request, the second handed the first's
// answer.)
func TestFlightNotSharedWithAnotherAsker(t *testing.T) {
	for _, c := range []struct {
		name      string
		header    string
		auth      string
		wantAuths []string
	}{
		{"same Authorization", "Authorization", "Bearer tenant-a", []string{"Bearer tenant-a"}},
		{"another Authorization", "Authorization", "Bearer tenant-b", []string{"Bearer tenant-a", "Bearer tenant-b"}},
		{"another X-Shopify-Access-Token", "X-Shopify-Access-Token", "Bearer tenant-b", []string{"Bearer tenant-a", "Bearer tenant-b"}},
		{"another Private-Token", "private-token", "Bearer tenant-b", []string{"Bearer tenant-a", "Bearer tenant-b"}},
		{"another X-Goog-Api-Key", "X-Goog-Api-Key", "Bearer tenant-b", []string{"Bearer tenant-a", "Bearer tenant-b"}},
		{"same X-Goog-Api-Key", "X-Goog-Api-Key", "Bearer tenant-a", []string{"Bearer tenant-a"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newPayServer(t)
			arrived, release := holdRequest(t, srv, 1)
			tr, _, _ := newTestTransport(t)
			send := func(auth string) <-chan paid {
				req := post(t, context.Background(), srv.URL, `{"amount":100}`)
				req.Header[c.header] = []string{auth} // as spelled
				return payAsync(tr, req)
			}
			first := send("Bearer tenant-a")
			<-arrived
			second := send(c.auth)
			awaitJoiners(t, tr, 1)
			release()
			for _, p := range []paid{<-first, <-second} {
				require.NoError(t, p.err)
				assert.Equal(t, http.StatusCreated, p.status)
			}
			var auths []string
			for _, r := range srv.seen() {
				auths = append(auths, r.Header.Get(c.header))
			}
			assert.Equal(t, c.wantAuths, auths)
			keys := keysOf(srv.seen())
			assert.Equal(t, keys[0], keys[len(keys)-1], "the action's key")
			assert.Equal(t, 1, srv.chargeCount())
		})
	}
}

// What another principal's identical unnamed payment gets where no flight
// is in the air to refuse it: within WithDuplicateWindow of the first, it
// is sent under the first's key with its own credentials, and a server
// that does not scope keys by principal (paytest's) replays the first's
// answer to it, charging nothing for it. doc.go ("One flight per action")
// says so; the test keeps the sentence true.
func TestOtherAskerWithinTheDuplicateWindowIsSentUnderTheFirstsKey(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithDuplicateWindow(time.Hour))
	pay := func(auth string) paid {
		req := post(t, context.Background(), srv.URL, `{"amount":100}`)
		req.Header.Set("Authorization", auth)
		return <-payAsync(tr, req)
	}
	a, b := pay("Bearer tenant-a"), pay("Bearer tenant-b")
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	reqs := srv.seen()
	require.Len(t, reqs, 2, "each principal's request is sent")
	assert.Equal(t, "Bearer tenant-b", reqs[1].Header.Get("Authorization"))
	assert.Equal(t, reqs[0].Key, reqs[1].Key, "under the first's key")
	assert.True(t, b.replay, "the server's replay of the first's answer")
	assert.Equal(t, a.body, b.body)
	assert.Equal(t, 1, srv.chargeCount())
}

// A leader that asks as one principal and whose caller ends while a
// caller of another principal waits hands the action over: the waiting
// caller carries it on under the action's key with its own credentials,
// and is never given an error or an answer of the leader's.
func TestFlightHandedOverToAnotherAskerCarriesTheActionOn(t *testing.T) {
	srv := newPayServer(t)
	atServer, release := holdRequest(t, srv, 1)
	tr, _, _ := newTestTransport(t, idemretry.WithBackOff(constant(0)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func(ctx context.Context, auth string) <-chan paid {
		req := post(t, ctx, srv.URL, `{"amount":100}`)
		req.Header.Set("Authorization", auth)
		return payAsync(tr, req)
	}
	leader := send(ctx, "Bearer tenant-a")
	<-atServer
	joiner := send(context.Background(), "Bearer tenant-b")
	awaitJoiners(t, tr, 1)
	cancel()
	<-leader
	release()
	p := <-joiner
	require.NoError(t, p.err)
	assert.Equal(t, http.StatusCreated, p.status)
	reqs := srv.seen()
	require.GreaterOrEqual(t, len(reqs), 2)
	last := reqs[len(reqs)-1]
	assert.Equal(t, "Bearer tenant-b", last.Header.Get("Authorization"), "sent with its own credentials")
	for _, r := range reqs {
		assert.Equal(t, reqs[0].Key, r.Key, "one key for the action")
	}
	assert.Equal(t, 1, srv.chargeCount())
}
