package idemretry_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// A caller that sets Accept-Encoding itself gets the server's gzip as it
// came (net/http decompresses only what it asked for). A payload-mismatch
// refusal so encoded is still recognised: never resent, the action's
// outcome unknown (ErrKeyReused); the caller that reads the answer reads
// its bytes unchanged.
func TestKeyReuseRecognisedInAGzipEncodedAnswer(t *testing.T) {
	for _, c := range keyReuseAnswers {
		if c.hdr != nil {
			continue // recognised by a header, not by its body
		}
		t.Run(c.name, func(t *testing.T) {
			enc := gzipped(t, c.body)
			srv := newPayServer(t)
			srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Content-Type", c.ctype)
				w.Header().Set("Content-Encoding", "gzip")
				w.WriteHeader(c.status)
				_, _ = w.Write(enc)
				return true
			}
			tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(2), idemretry.WithBackOff(constant(time.Millisecond)))
			req := post(t, idemretry.WithAction(context.Background(), "pay:gzip"), srv.URL, `{"amount":100}`)
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := tr.RoundTrip(req)
			assert.Len(t, srv.seen(), 1, "a payload mismatch must not be resent")
			if err != nil {
				require.ErrorIs(t, err, idemretry.ErrKeyReused)
				return
			}
			assert.Equal(t, c.status, resp.StatusCode)
			assert.True(t, idemretry.KeyReuseRejected(resp))
			got, rerr := io.ReadAll(resp.Body)
			require.NoError(t, rerr)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, enc, got, "the caller reads the encoded bytes as they came")
		})
	}
}

// A body that says gzip and is not (judged as it came: a refusal in plain
// JSON is still one), one cut inside its compressed stream, and one that is
// not valid deflate: never a panic, the body whole for the caller.
func TestKeyReuseRejectedOnBadGzip(t *testing.T) {
	refusal := `{"error":{"code":"idempotency_key_reused"}}`
	for _, c := range []struct {
		name string
		body []byte
		want bool
	}{
		{"not encoded at all", []byte(refusal), true},
		{"cut in its header", gzipped(t, refusal)[:12], false},
		{"not deflate", []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0xde, 0xad, 0xbe, 0xef}, false},
		{"whole", gzipped(t, refusal), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, _ := response(http.StatusConflict, "application/json", string(c.body), "Content-Encoding", "gzip")
			assert.Equal(t, c.want, idemretry.KeyReuseRejected(resp))
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, c.body, got)
		})
	}
}

// Decoding is for gzip alone, as the only coding: a refusal compressed
// otherwise is not recognised (and net/http's own decompression, which
// leaves no Content-Encoding, needs none).
func TestKeyReuseRejectedDecodesGzipOnly(t *testing.T) {
	enc := gzipped(t, `{"error":{"code":"idempotency_key_reused"}}`)
	for _, ce := range []string{"GZIP", " x-gzip "} {
		resp, _ := response(http.StatusConflict, "application/json", string(enc), "Content-Encoding", ce)
		assert.True(t, idemretry.KeyReuseRejected(resp), ce)
	}
	for _, ce := range [][]string{{"Content-Encoding", "br"}, {"Content-Encoding", "gzip, br"}, {"Content-Encoding", "gzip", "Content-Encoding", "br"}} {
		resp, _ := response(http.StatusConflict, "application/json", string(enc), ce...)
		assert.False(t, idemretry.KeyReuseRejected(resp), ce)
	}
}
