package idemretry_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// A 101 Switching Protocols answer to a request asking to upgrade (a
// WebSocket handshake, as coder/websocket sends it through an
// http.Client): net/http gives it a body that is an io.ReadWriteCloser,
// the upgraded connection, which the caller writes to. Through the
// Transport, the body handed back must still be one, and carry bytes
// both ways.
//
// Found in review hv2 (c605033; was TestHV2SwitchingProtocolsBodyStaysWritable).
func TestSwitchingProtocolsBodyStaysWritable(t *testing.T) {
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
