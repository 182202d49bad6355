package idemretry_test

// Review hV2: the answer classification (hints.go, retry.go, run.classify)
// over real HTTP, with exact wire bytes where the header's shape matters.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// rawServer answers each HTTP/1.1 request on loopback with the exact bytes
// its answer writes to the connection (answer reports whether to keep the
// connection open for the next request).
type rawServer struct {
	ln     net.Listener
	n      atomic.Int32
	answer func(n int, c net.Conn) (keep bool)
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newRawServer(t *testing.T, answer func(n int, c net.Conn) bool) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &rawServer{ln: ln, answer: answer}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if !s.answer(int(s.n.Add(1)), c) {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) URL() string { return "http://" + s.ln.Addr().String() }

// always answers every request with the same bytes, keeping the connection.
func always(wire string) func(int, net.Conn) bool {
	return func(_ int, c net.Conn) bool {
		_, err := io.WriteString(c, wire)
		return err == nil
	}
}

// sendRaw sends one named POST through a Transport allowing two retries
// to srv, and returns the response (its body read whole), the body and the
// number of requests the server saw.
func sendRaw(t *testing.T, srv *rawServer, opts ...idemretry.Option) (*http.Response, string, int) {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := idemretry.NewTransport(base, append([]idemretry.Option{idemretry.WithJournal(journal.NewMemory()),
		idemretry.WithMaxRetries(2), idemretry.WithBackOff(constant(time.Millisecond))}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:hv2"), srv.URL(), `{"amount":100}`))
	require.NoError(t, err)
	body := readAll(t, resp)
	return resp, body, int(srv.n.Load())
}

// pad returns n distinct header lines that mean nothing to the classifier.
func pad(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-Pad-%d: %d\r\n", i, i)
	}
	return b.String()
}

// A retry hint sent on two lines of the same name (as a gateway adding
// its own hint to the application's would) is two hints: when they
// disagree, "false" wins (README: "several retry hints | disagree | false
// wins"), whichever line comes first and whatever the header's size (the
// one-pass scan of at most 8 names and the lookups above). An empty line
// before "false" does not hide it. Over HTTP/1.1 exact bytes.
//
// Found in review hv2 (7ce9851; was TestHV2DuplicateRetryHintFalseWins).
func TestHintDuplicateRetryHintFalseWins(t *testing.T) {
	cases := []struct {
		name, lines string
	}{
		{"true then false", "X-Should-Retry: true\r\nX-Should-Retry: false\r\n"},
		{"empty then false", "Stripe-Should-Retry:\r\nStripe-Should-Retry: false\r\n"},
		{"garbage then false", "Transient-Error: maybe\r\nTransient-Error: \"false\"\r\n"},
		{"odd case lines", "x-should-retry: TRUE\r\nX-SHOULD-RETRY: False\r\n"},
	}
	for _, c := range cases {
		// Content-Length + the two lines (one name) + padding: 2 to 12
		// names, on both sides of scanHeaders (8).
		for _, extra := range []int{0, 6, 7, 8, 11} {
			t.Run(fmt.Sprintf("%s/%d names", c.name, 2+extra), func(t *testing.T) {
				srv := newRawServer(t, always("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n"+c.lines+pad(extra)+"\r\nbusy"))
				resp, body, n := sendRaw(t, srv)
				assert.Equal(t, 503, resp.StatusCode)
				assert.Equal(t, "busy", body)
				assert.Equal(t, 1, n, "a 503 with a retry hint saying false on one of its lines must not be resent")
			})
		}
	}
	// A 400 with "true" on one line and "false" on the other stays final.
	srv := newRawServer(t, always("HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nX-Should-Retry: true\r\nX-Should-Retry: false\r\n\r\nno"))
	_, _, n := sendRaw(t, srv)
	assert.Equal(t, 1, n)
}

// The same over HTTP/2 (TLS, ALPN h2): two field lines of one name.
//
// Found in review hv2 (7ce9851; was TestHV2DuplicateRetryHintFalseWinsHTTP2).
func TestHintDuplicateRetryHintFalseWinsOverHTTP2(t *testing.T) {
	for _, extra := range []int{0, 7, 12} {
		t.Run(fmt.Sprintf("%d extra names", extra), func(t *testing.T) {
			var n atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				n.Add(1)
				if r.ProtoMajor != 2 {
					w.WriteHeader(http.StatusHTTPVersionNotSupported)
					return
				}
				w.Header()["X-Should-Retry"] = []string{"true", "false"}
				for i := range extra {
					w.Header().Set(fmt.Sprintf("X-Pad-%d", i), "1")
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, "busy")
			}))
			srv.EnableHTTP2 = true
			srv.StartTLS()
			defer srv.Close()
			base := srv.Client().Transport.(*http.Transport)
			tr, ctx := retryTwiceOver(t, base)
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:h2"), srv.URL, `{"amount":1}`))
			require.NoError(t, err)
			assert.Equal(t, 2, resp.ProtoMajor)
			assert.Equal(t, 503, resp.StatusCode)
			assert.Equal(t, "busy", readAll(t, resp))
			assert.Equal(t, int32(1), n.Load())
		})
	}
}

// A replay mark on a line after an empty one of the same name is a replay:
// the stored 500 is final, and IsReplay says so, at any header size.
//
// Found in review hv2 (7ce9851; was TestHV2ReplayOnSecondLine).
func TestHintReplayOnSecondLine(t *testing.T) {
	for _, extra := range []int{0, 7, 10} {
		t.Run(fmt.Sprintf("%d extra names", extra), func(t *testing.T) {
			srv := newRawServer(t, always("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 6\r\nIdempotent-Replayed:\r\nIdempotent-Replayed: true\r\n"+pad(extra)+"\r\nstored"))
			resp, body, n := sendRaw(t, srv)
			assert.Equal(t, "stored", body)
			assert.True(t, idemretry.IsReplay(resp))
			assert.Equal(t, 1, n, "a replayed answer is final")
		})
	}
}

// Informational answers (103 Early Hints, 100 Continue) before the final
// one carry headers that are not the answer's: a retry hint or a replay
// mark on them changes nothing. A 503 after a 103 saying "false" and
// "replayed" is retried; a 400 after a 103 saying "true" is final.
//
// Found in review hv2 (7ce9851; was TestHV2InformationalHeadersAreNotTheAnswers).
func TestHintsOfInformationalAnswersAreNotTheAnswers(t *testing.T) {
	srv := newRawServer(t, always("HTTP/1.1 103 Early Hints\r\nX-Should-Retry: false\r\nIdempotent-Replayed: true\r\nLink: </a.css>; rel=preload\r\n\r\n"+
		"HTTP/1.1 100 Continue\r\nStripe-Should-Retry: false\r\n\r\n"+
		"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"))
	resp, body, n := sendRaw(t, srv)
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, "busy", body)
	assert.False(t, idemretry.IsReplay(resp))
	assert.Equal(t, 3, n)

	srv = newRawServer(t, always("HTTP/1.1 103 Early Hints\r\nX-Should-Retry: true\r\n\r\n"+
		"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno"))
	resp, body, n = sendRaw(t, srv)
	assert.Equal(t, 400, resp.StatusCode)
	assert.Equal(t, "no", body)
	assert.Equal(t, 1, n)
}

// A hint folded onto a continuation line (obs-fold) or with an empty
// value: the header net/http builds is what the classifier reads.
//
// Found in review hv2 (7ce9851; was TestHV2FoldedAndEmptyHints).
func TestHintsFoldedAndEmpty(t *testing.T) {
	srv := newRawServer(t, always("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nX-Should-Retry:\r\n false\r\n\r\n"))
	resp, _, n := sendRaw(t, srv)
	if resp.Header.Get("X-Should-Retry") == "false" {
		assert.Equal(t, 1, n, "folded false: final")
	} else {
		assert.Equal(t, 3, n)
	}
	srv = newRawServer(t, always("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nX-Should-Retry:\r\nTransient-Error: \r\n\r\n"))
	_, _, n = sendRaw(t, srv)
	assert.Equal(t, 3, n, "empty hints say nothing: the 503 is retried")
}

// jsonOf returns a JSON error body of exactly size bytes (size >= 64)
// whose code, at its start, says nothing about idempotency.
func jsonOf(size int) string {
	head := `{"error":{"code":"card_declined","message":"`
	tail := `"}}`
	return head + strings.Repeat("m", size-len(head)-len(tail)) + tail
}

// A final JSON error answer (400, 422: KeyReuseRejected peeks at it) and a
// 409 retried until the retries are spent come back with their bodies
// whole, byte for byte, at sizes around the 8 KiB peek, over HTTP/1.1
// exact bytes, plain and gzip-encoded (decoded by net/http, and left
// encoded when the caller asked for gzip itself).
//
// Found in review hv2 (7ce9851; was TestHV2PeekedBodiesWholeAroundThePeekLimit).
func TestPeekedBodiesWholeAroundThePeekLimit(t *testing.T) {
	for _, status := range []int{400, 409, 422} {
		for _, size := range []int{64, 8191, 8192, 8193, 16384, 70000} {
			for _, enc := range []string{"identity", "gzip", "gzip-asked"} {
				t.Run(fmt.Sprintf("%d/%d/%s", status, size, enc), func(t *testing.T) {
					body := jsonOf(size)
					wire := body
					extra := ""
					if enc != "identity" {
						var b bytes.Buffer
						zw := gzip.NewWriter(&b)
						io.WriteString(zw, body)
						zw.Close()
						wire = b.String()
						extra = "Content-Encoding: gzip\r\n"
					}
					srv := newRawServer(t, always(fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
						status, http.StatusText(status), extra, len(wire), wire)))
					base := &http.Transport{}
					defer base.CloseIdleConnections()
					tr, ctx := retryTwiceOver(t, base)
					req := post(t, idemretry.WithAction(ctx, "pay:peek"), srv.URL(), `{"amount":1}`)
					want := body
					if enc == "gzip-asked" {
						req.Header.Set("Accept-Encoding", "gzip")
						want = wire
					}
					resp, err := tr.RoundTrip(req)
					require.NoError(t, err)
					assert.Equal(t, status, resp.StatusCode)
					got := readAll(t, resp)
					assert.Equal(t, len(want), len(got))
					assert.True(t, got == want, "the body must come back whole and unmodified")
					wantN := 1
					if status == 409 {
						wantN = 3
					}
					assert.Equal(t, int32(wantN), srv.n.Load())
				})
			}
		}
	}
}

// A final JSON answer whose body breaks off (declared longer than sent,
// then the connection closes) before and after the 8 KiB peek: the caller
// reads every byte sent, then an error, as it would without idemretry;
// never a clean EOF on a short body.
//
// Found in review hv2 (7ce9851; was TestHV2PeekedBodyThatBreaksOff).
func TestPeekedBodyThatBreaksOff(t *testing.T) {
	for _, sent := range []int{100, 8000, 8192, 9000} {
		t.Run(fmt.Sprint(sent), func(t *testing.T) {
			body := jsonOf(20000)[:sent]
			srv := newRawServer(t, func(_ int, c net.Conn) bool {
				fmt.Fprintf(c, "HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\nContent-Length: 20000\r\n\r\n%s", body)
				return false
			})
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tr, ctx := retryTwiceOver(t, base)
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:broken"), srv.URL(), `{"amount":1}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			assert.Equal(t, body, string(got))
			assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			assert.Equal(t, int32(1), srv.n.Load())
		})
	}
}

// A final JSON error answer (400 and 422: not retried, no hint) whose
// first bytes arrive slowly: the body's first part, then, after longer
// than DefaultMaxDrainTime, the rest (all within the 8 KiB peek).
// KeyReuseRejected's peek at it, within RoundTrip, is bounded by
// DefaultMaxDrainTime like every read made while judging (RetryPolicy's
// contract: a body that stalls must not hold RoundTrip), so the attempt is
// cut there. What this pins: RoundTrip returns the answer, and the caller
// is never handed a short body that reads as whole: it reads a prefix of
// the real body, then an error. (README's "gives the body back whole"
// holds only for a body whose first 8 KiB arrive within 200 ms; without
// idemretry, the caller reads this one whole.)
//
// Found in review hv2 (7ce9851; was TestHV2SlowFinalJSONBodyCutNeverShort).
func TestPeekedSlowFinalJSONBodyNeverCutShort(t *testing.T) {
	for _, status := range []int{400, 422} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			body := jsonOf(3000)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				w.WriteHeader(status)
				io.WriteString(w, body[:1000])
				w.(http.Flusher).Flush()
				select {
				case <-time.After(5 * idemretry.DefaultMaxDrainTime):
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, body[1000:])
			}))
			defer srv.Close()
			tr := transportOver(t, journal.NewMemory())
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:slowfinal"), srv.URL, `{"amount":1}`))
			require.NoError(t, err)
			assert.Equal(t, status, resp.StatusCode)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err == nil {
				assert.Equal(t, body, string(got), "a body read to its end must be the whole body")
			} else {
				assert.True(t, strings.HasPrefix(body, string(got)), "what is read before the error is the body's start")
			}
		})
	}
}

// A hint saying "true" retries a 400 and a 422 (README guarantee 4: "unless
// a server hint says so"), but never a replayed one, and never one that
// refuses the key as reused; "false" beats "true" across names on them.
//
// Found in review hv2 (7ce9851; was TestHV2HintsOn4xx).
func TestHintsOn4xx(t *testing.T) {
	cases := []struct {
		name  string
		wire  string
		n     int
		reuse bool
	}{
		{"400 true", "HTTP/1.1 400 Bad Request\r\nX-Should-Retry: true\r\nContent-Length: 0\r\n\r\n", 3, false},
		{"422 true", "HTTP/1.1 422 Unprocessable Entity\r\nTransient-Error: true\r\nContent-Length: 0\r\n\r\n", 3, false},
		{"404 true", "HTTP/1.1 404 Not Found\r\nStripe-Should-Retry: true\r\nContent-Length: 0\r\n\r\n", 3, false},
		{"400 true replayed", "HTTP/1.1 400 Bad Request\r\nX-Should-Retry: true\r\nIdempotency-Replay: \"TRUE\"\r\nContent-Length: 0\r\n\r\n", 1, false},
		{"422 true false", "HTTP/1.1 422 Unprocessable Entity\r\nX-Should-Retry: true\r\nTransient-Error: false\r\nContent-Length: 0\r\n\r\n", 1, false},
		{"400 false", "HTTP/1.1 400 Bad Request\r\nX-Should-Retry: false\r\nContent-Length: 0\r\n\r\n", 1, false},
		{"422 true reuse", "HTTP/1.1 422 Unprocessable Entity\r\nX-Should-Retry: true\r\nContent-Type: application/problem+json\r\nContent-Length: 43\r\n\r\n{\"title\":\"Idempotency-Key is already used\"}", 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newRawServer(t, always(c.wire))
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tr, ctx := retryTwiceOver(t, base)
			resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, "pay:4xx"), srv.URL(), `{"amount":1}`))
			if c.reuse {
				require.ErrorIs(t, err, idemretry.ErrKeyReused)
			} else {
				require.NoError(t, err)
				readAll(t, resp)
			}
			assert.Equal(t, int32(c.n), srv.n.Load())
		})
	}
}

// The same over HTTP/2 (TLS, ALPN h2): final 400/422 and a 409 retried
// until the retries are spent, at sizes around the 8 KiB peek, come back
// whole, byte for byte.
//
// Found in review hv2 (7ce9851; was TestHV2PeekedBodiesWholeHTTP2).
func TestPeekedBodiesWholeOverHTTP2(t *testing.T) {
	var status atomic.Int32
	var body atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.ProtoMajor != 2 {
			w.WriteHeader(http.StatusHTTPVersionNotSupported)
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(int(status.Load()))
		io.WriteString(w, body.Load().(string))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	base := srv.Client().Transport.(*http.Transport)
	for _, st := range []int{400, 409, 422} {
		for _, size := range []int{8191, 8192, 8193, 70000} {
			t.Run(fmt.Sprintf("%d/%d", st, size), func(t *testing.T) {
				want := jsonOf(size)
				status.Store(int32(st))
				body.Store(want)
				tr, ctx := retryTwiceOver(t, base)
				resp, err := tr.RoundTrip(post(t, idemretry.WithAction(ctx, fmt.Sprintf("pay:h2peek:%d:%d", st, size)), srv.URL, `{"amount":1}`))
				require.NoError(t, err)
				assert.Equal(t, 2, resp.ProtoMajor)
				assert.Equal(t, st, resp.StatusCode)
				got := readAll(t, resp)
				assert.True(t, got == want, "the body must come back whole and unmodified (%d of %d bytes)", len(got), len(want))
			})
		}
	}
}
