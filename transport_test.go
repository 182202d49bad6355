package idemretry_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// The Transport as a drop-in http.RoundTripper (transport.go): the
// caller's request left as it was, its body sent whole on every attempt,
// an answer without a body kept http.NoBody, a 101's body writable,
// invalid requests refused.

// Every attempt carries the same bytes, with GetBody and without.
func TestBodyIdenticalOnEveryAttempt(t *testing.T) {
	payload := strings.Repeat(`{"line":"0123456789abcdef"}`, 2000)
	want := sha256.Sum256([]byte(payload))
	bodies := map[string]func() io.Reader{
		"GetBody":  func() io.Reader { return strings.NewReader(payload) },
		"buffered": func() io.Reader { return onlyReader{strings.NewReader(payload)} },
	}
	for name, mk := range bodies {
		t.Run(name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(status(500), status(502), status(503))
			tr, _, _ := newTestTransport(t)
			req, err := http.NewRequest(http.MethodPost, srv.URL, mk())
			require.NoError(t, err)
			roundTrip(t, tr, req)
			reqs := srv.seen()
			require.Len(t, reqs, 4)
			for _, r := range reqs {
				assert.Equal(t, want, r.BodyHash)
			}
		})
	}
}

// A body that cannot be rewound and is over the buffering limit is refused
// before anything is sent, and closed.
func TestNonRewindableBodyOverLimitRefused(t *testing.T) {
	srv := newPayServer(t)
	tr, _, _ := newTestTransport(t, idemretry.WithMaxBufferedBody(1024))
	body := &closeTracker{Reader: bytes.NewReader(make([]byte, 1025))}
	req, err := http.NewRequest(http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	require.Nil(t, req.GetBody)
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, idemretry.ErrBodyTooLarge)
	assert.Empty(t, srv.seen())
	assert.True(t, body.isClosed())

	// At the limit it is buffered and retried intact.
	srv.script = scriptFirst(status(503))
	body = &closeTracker{Reader: bytes.NewReader(make([]byte, 1024))}
	req, err = http.NewRequest(http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	roundTrip(t, tr, req)
	assert.Len(t, srv.seen(), 2)
	assert.True(t, body.isClosed())
}

// halfReadingBase reads part of the first attempt's body and fails as a
// dropped connection would; later attempts go through.
type halfReadingBase struct {
	base  http.RoundTripper
	calls atomic.Int32
}

func (h *halfReadingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if h.calls.Add(1) == 1 {
		_, _ = io.CopyN(io.Discard, req.Body, 300)
		req.Body.Close()
		return nil, errors.New("test: connection reset by peer")
	}
	return h.base.RoundTrip(req)
}

// A body the base read part of before failing is sent whole on the retry,
// under the same key, and the action is then one payload with a later
// resend of it.
//
// Found in review hw1 (f949e43; was TestHW1BodyCutByTheBaseIsResentWhole).
func TestBodyCutByTheBaseIsResentWhole(t *testing.T) {
	t.Parallel()
	for _, getBody := range []bool{false, true} {
		for _, size := range []int{513, 64<<10 + 1} {
			var got []int
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got = append(got, len(b))
				w.WriteHeader(http.StatusCreated)
			})
			base := &halfReadingBase{base: &http.Transport{}}
			tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()), idemretry.WithBackOff(constant(0)))
			require.NoError(t, err)
			body := bytes.Repeat([]byte{'x'}, size)
			resp, err := tr.RoundTrip(boundaryRequest(t, srv.URL, "pay:cut", body, getBody))
			require.NoError(t, err)
			readAll(t, resp)
			resp, err = tr.RoundTrip(boundaryRequest(t, srv.URL, "pay:cut", body, !getBody))
			require.NoError(t, err, "the same payload refused")
			readAll(t, resp)
			assert.Equal(t, []int{size, size}, got, "GetBody %v", getBody)
			require.NoError(t, tr.Close())
			base.base.(*http.Transport).CloseIdleConnections()
		}
	}
}

// I6: the caller's request is left exactly as it was.
func TestCallerRequestNotMutated(t *testing.T) {
	srv := newPayServer(t)
	srv.script = scriptFirst(status(503))
	tr, _, _ := newTestTransport(t)
	req := post(t, idemretry.WithAction(context.Background(), "pay:i6"), srv.URL, "abc")
	req.Header.Set("X-Trace", "1")
	before := req.Header.Clone()
	getBody := req.GetBody
	roundTrip(t, tr, req)
	assert.Equal(t, before, req.Header, "no key header added to the caller's request")
	assert.NotNil(t, getBody)
	rc, err := req.GetBody()
	require.NoError(t, err)
	b, _ := io.ReadAll(rc)
	assert.Equal(t, "abc", string(b))
}

// Invalid requests get a typed error, never a panic.
func TestInvalidRequests(t *testing.T) {
	tr, _, _ := newTestTransport(t)
	_, err := tr.RoundTrip(nil)
	assert.ErrorIs(t, err, idemretry.ErrInvalidRequest)
	_, err = tr.RoundTrip(&http.Request{Method: http.MethodPost})
	assert.ErrorIs(t, err, idemretry.ErrInvalidRequest)
	req, _ := http.NewRequest(http.MethodPost, "/relative", nil)
	_, err = tr.RoundTrip(req)
	assert.ErrorIs(t, err, idemretry.ErrInvalidRequest)
	_, err = idemretry.NewTransport(nil, inMemory(), idemretry.WithKeyWindow(0))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
}

// A Transport with no base gets its own clone of http.DefaultTransport, so
// closing it closes nobody else's connections; and WithJournal with
// WithJournalDir is a mistake, refused.
func TestNewTransportDefaults(t *testing.T) {
	_, err := idemretry.NewTransport(nil, inMemory(), idemretry.WithJournalDir(t.TempDir()))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)

	srv := newPayServer(t)
	get := func() (reused bool) {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		resp, err := http.DefaultTransport.RoundTrip(req)
		require.NoError(t, err)
		readAll(t, resp)
		return reused
	}
	get() // leaves an idle connection in http.DefaultTransport's pool
	own, err := idemretry.NewTransport(nil, inMemory())
	require.NoError(t, err)
	resp, err := own.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	require.NoError(t, err)
	readAll(t, resp)
	require.NoError(t, own.Close())
	assert.True(t, get(), "closing the Transport left http.DefaultTransport's connections alone")
}

// A drop-in transport leaves an answer without a body as net/http gives
// it: resp.Body == http.NoBody (a 204, a HEAD, a Content-Length: 0), which
// callers test to skip a read, keyed or not.
func TestAnswerWithoutABodyStaysNoBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Empty") == "length" {
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tr, _, _ := newTestTransport(t)
	c := &http.Client{Transport: tr}
	for _, tc := range []struct {
		name, method, empty string
		named               bool
	}{
		{"POST 204, named", http.MethodPost, "", true},
		{"POST 204, unnamed", http.MethodPost, "", false},
		{"POST 201 Content-Length 0, named", http.MethodPost, "length", true},
		{"HEAD", http.MethodHead, "", false},
		{"GET 204", http.MethodGet, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.named {
				ctx = idemretry.WithAction(ctx, "nobody:"+tc.name)
			}
			var body io.Reader
			if tc.method == http.MethodPost {
				body = bytes.NewReader([]byte(`{"amount":100}`))
			}
			req, err := http.NewRequestWithContext(ctx, tc.method, srv.URL, body)
			require.NoError(t, err)
			req.Header.Set("X-Empty", tc.empty)
			base, err := http.DefaultTransport.RoundTrip(req.Clone(ctx))
			require.NoError(t, err)
			require.NoError(t, base.Body.Close())
			require.Equal(t, http.NoBody, base.Body, "net/http itself gives this answer a body: the case tests nothing")

			if tc.method == http.MethodPost {
				req, err = http.NewRequestWithContext(ctx, tc.method, srv.URL, bytes.NewReader([]byte(`{"amount":100}`)))
				require.NoError(t, err)
				req.Header.Set("X-Empty", tc.empty)
			}
			resp, err := c.Do(req)
			require.NoError(t, err)
			assert.Equal(t, http.NoBody, resp.Body)
			n, err := io.Copy(io.Discard, resp.Body)
			assert.NoError(t, err)
			assert.Zero(t, n)
			assert.NoError(t, resp.Body.Close())
		})
	}
}

// A caller that joined the flight of an answer without a body gets
// http.NoBody too.
func TestJoinerOfAnAnswerWithoutABodyGetsNoBody(t *testing.T) {
	arrived, answer := make(chan struct{}, 2), make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		requests.Add(1)
		arrived <- struct{}{}
		<-answer
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tr, _, _ := newTestTransport(t)
	c := &http.Client{Transport: tr}
	post := func() (*http.Response, error) {
		return c.Post(srv.URL, "application/json", bytes.NewReader([]byte(`{"amount":100}`)))
	}
	type result struct {
		resp *http.Response
		err  error
	}
	first := make(chan result, 1)
	go func() {
		resp, err := post()
		first <- result{resp, err}
	}()
	<-arrived
	second := make(chan result, 1)
	go func() {
		resp, err := post() // the same method, URL and body: it joins the flight
		second <- result{resp, err}
	}()
	time.Sleep(100 * time.Millisecond) // the second tap has joined
	close(answer)
	for _, ch := range []chan result{first, second} {
		r := <-ch
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusNoContent, r.resp.StatusCode)
		assert.Equal(t, http.NoBody, r.resp.Body)
		assert.NoError(t, r.resp.Body.Close())
	}
	assert.Equal(t, int32(1), requests.Load(), "the second tap did not join the first's flight: the test tested nothing")
}

// A 101 Switching Protocols answer to a request asking to upgrade (a
// WebSocket handshake, as coder/websocket sends it through an
// http.Client): net/http gives it a body that is an io.ReadWriteCloser,
// the upgraded connection, which the caller writes to. Through the
// Transport, the body handed back must still be one, and carry bytes
// both ways.
//
// Found in review hv2 (c605033; was TestHV2SwitchingProtocolsBodyStaysWritable).
func TestSwitchingProtocolsBodyStaysWritable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		brw.WriteString("echo " + line)
		brw.Flush()
	}))
	defer srv.Close()
	tr := transportOver(t, journal.NewMemory())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, "upgrade:"+method), method, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		require.True(t, ok, "%s: a 101's body must stay an io.ReadWriteCloser, got %T", method, resp.Body)
		_, err = io.WriteString(rwc, "hi\n")
		require.NoError(t, err)
		got, err := bufio.NewReader(rwc).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "echo hi\n", got)
		rwc.Close()
	}
}

// hW3's review of answers without a body (http.NoBody kept, the attempt
// ended at once): over HTTP/1.1 and HTTP/2, with the request body still
// being sent when the server answered, with 100-continue, and connection
// reuse.

// Found in review hw3 (ca18fb8; was TestHW3AnswerWithoutABodyOverBothProtocols).
func TestAnswerWithoutABodyOverBothProtocols(t *testing.T) {
	t.Parallel()
	for _, h2 := range []bool{false, true} {
		for _, early := range []bool{false, true} {
			t.Run(fmt.Sprintf("h2=%v early=%v", h2, early), func(t *testing.T) {
				var conns atomic.Int32
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if !early {
						_, _ = io.Copy(io.Discard, r.Body)
					}
					w.WriteHeader(http.StatusNoContent)
				}))
				srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
					if s == http.StateNew {
						conns.Add(1)
					}
				}
				srv.EnableHTTP2 = h2
				srv.StartTLS()
				defer srv.Close()
				base := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
					ForceAttemptHTTP2: h2, ExpectContinueTimeout: time.Second}
				defer base.CloseIdleConnections()
				tr, err := idemretry.NewTransport(base, idemretry.WithJournal(journal.NewMemory()))
				require.NoError(t, err)
				defer tr.Close()
				size := 64
				if early {
					size = 4 << 20 // more than the socket buffers take: still being sent at the answer
				}
				payload := bytes.Repeat([]byte("x"), size)
				const n = 8
				for i := range n {
					ctx := idemretry.WithAction(context.Background(), fmt.Sprintf("nobody:%d", i))
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(payload))
					require.NoError(t, err)
					if i%2 == 1 {
						req.Header.Set("Expect", "100-continue")
					}
					resp, err := tr.RoundTrip(req)
					require.NoError(t, err, "request %d", i)
					require.Equal(t, http.StatusNoContent, resp.StatusCode)
					b, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					require.Empty(t, b)
					require.NoError(t, resp.Body.Close())
					if !h2 { // net/http's HTTP/2 gives a body of its own, not http.NoBody
						assert.Equal(t, http.NoBody, resp.Body)
					}
				}
				if !early {
					assert.EqualValues(t, 1, conns.Load(), "answers without a body did not reuse the connection")
				}
			})
		}
	}
}
