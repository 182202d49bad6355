package interop

// Request bodies as the SDKs hand them to idemretry: with a GetBody of
// their own, which may share its reader with Body.

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// openai-go given a *bytes.Reader body (option.WithRequestBody) sets a
// GetBody that seeks that same reader back to 0 and returns it, and Body
// to GetBody's first reader: Body and every GetBody copy are one reader.
// net/http calls GetBody only after Body was sent; idemretry's fingerprint
// reads a GetBody copy before the first attempt, so the first attempt must
// not send a Body that the fingerprint left at its end. One request, with
// the whole body, under the recommended settings (openai-go's retries
// off, one idemretry attempt is enough for a server that answers).
func TestGetBodySharingBodysReader(t *testing.T) {
	const payload = `{"model":"gpt-interop","messages":[{"role":"user","content":"hi"}]}`
	srv := newWire(t, always(http.StatusOK, chatCompletion(1), "Content-Type", "application/json"))
	tr, _ := newTransport(t, nil, idemretry.WithBackOff(noWait), idemretry.WithRequireAction())
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("sk-interop"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
	var got openai.ChatCompletion
	err := c.Post(idemretry.WithAction(bg, "chat:reader-1"), "chat/completions", nil, &got,
		option.WithRequestBody("application/json", bytes.NewReader([]byte(payload))))
	require.NoError(t, err)
	assert.Equal(t, "chatcmpl-1", got.ID)
	srv.mu.Lock()
	bodies := append([]string(nil), srv.bodies...)
	srv.mu.Unlock()
	assert.Equal(t, []string{payload}, bodies, "one request, with the whole body")
	assert.Equal(t, int64(1), tr.Stats().Attempts, "one attempt")
}
