package idemretry_test

// hW3's review of answers without a body (http.NoBody kept, the attempt
// ended at once): over HTTP/1.1 and HTTP/2, with the request body still
// being sent when the server answered, with 100-continue, and connection
// reuse.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Found in review hw3 (ca18fb8; was TestHW3AnswerWithoutABodyOverBothProtocols).
func TestAnswerWithoutABodyOverBothProtocols(t *testing.T) {
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
