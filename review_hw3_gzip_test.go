package idemretry_test

// hW3's review of KeyReuseRejected on a body net/http left gzip-encoded:
// over loopback, a bomb, several members, a body sent in pieces, and the
// caller's read of the bytes as they came.

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// Found in review hw3 (ca18fb8; was TestHW3KeyReuseInGzipOverLoopback).
func TestKeyReuseInGzipOverLoopback(t *testing.T) {
	refusal := `{"error":{"type":"idempotency_error","message":"` // the rest follows
	bomb := func() []byte {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, _ = zw.Write([]byte(refusal))
		_, _ = zw.Write(bytes.Repeat([]byte("a"), 64<<20)) // 64 MiB in ~64 KiB
		_, _ = zw.Write([]byte(`"}}`))
		_ = zw.Close()
		return b.Bytes()
	}()
	members := append(gzipped(t, `{"error":{"type":`), gzipped(t, `"idempotency_error"}}`)...)
	late := gzipped(t, `{"pad":"`+strings.Repeat("b", 9<<10)+`","error":{"type":"idempotency_error"}}`)
	for _, c := range []struct {
		name   string
		body   []byte
		pieces bool
		want   bool
	}{
		{"bomb", bomb, false, true},
		{"two members", members, false, true},
		{"in pieces", gzipped(t, `{"error":{"type":"idempotency_error"}}`), true, true},
		{"refusal past 8 KiB decoded", late, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", "gzip")
				w.WriteHeader(http.StatusBadRequest)
				if !c.pieces {
					_, _ = w.Write(c.body)
					return
				}
				for _, b := range c.body {
					_, _ = w.Write([]byte{b})
					w.(http.Flusher).Flush()
					time.Sleep(time.Millisecond)
				}
			})
			req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
			require.NoError(t, err)
			req.Header.Set("Accept-Encoding", "gzip")
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			resp, err := base.RoundTrip(req)
			require.NoError(t, err)
			require.False(t, resp.Uncompressed)
			assert.Equal(t, c.want, idemretry.KeyReuseRejected(resp))
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.True(t, bytes.Equal(c.body, got), "the caller did not read the bytes as they came")
		})
	}
}
