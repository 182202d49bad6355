package interop

// openai-go over idemretry against a local server that speaks OpenAI's
// wire shapes: a JSON chat completion, its error object, X-Should-Retry.

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

func chatCompletion(c int) string {
	return fmt.Sprintf(`{"id":"chatcmpl-%d","object":"chat.completion","created":1767225600,"model":"gpt-4o-mini",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"ok","refusal":null},"finish_reason":"stop","logprobs":null}],`+
		`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, c)
}

// openai-go with WithMaxRetries(0) over idemretry, a named action: a 503,
// then a completion whose answer is lost, then the server's replay. openai-go
// sets no key of its own: idemretry's is on every attempt, the server makes
// one completion, and openai-go returns it. An X-Should-Retry: false on a
// 503 is final: one request.
func TestOpenAIOverIdemretry(t *testing.T) {
	srv := newLedgerServer(t, chatCompletion)
	srv.faults(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			write(w, http.StatusServiceUnavailable, `{"error":{"message":"The server is overloaded.","type":"server_error","param":null,"code":null}}`,
				"Content-Type", "application/json")
			return true
		}
		return false
	}, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 2 {
			hijackAndClose(w, false)
			return true
		}
		return false
	})
	tr, _ := newTransport(t, nil, idemretry.WithBackOff(noWait), idemretry.WithRequireAction())
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("sk-interop"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
	got, err := c.Chat.Completions.New(idemretry.WithAction(bg, "chat:summary-7"), chatParams)
	require.NoError(t, err)
	assert.Equal(t, "chatcmpl-1", got.ID)
	assert.Equal(t, "ok", got.Choices[0].Message.Content)
	keys := srv.seenKeys()
	require.Len(t, keys, 3)
	assert.Len(t, unique(keys), 1)
	assert.NotEmpty(t, keys[0])
	assert.Equal(t, 1, srv.chargeCount())

	final := newWire(t, always(http.StatusServiceUnavailable, `{"error":{"message":"no","type":"server_error"}}`,
		"Content-Type", "application/json", "X-Should-Retry", "false"))
	c = openai.NewClient(option.WithBaseURL(final.URL+"/v1/"), option.WithAPIKey("sk-interop"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
	_, err = c.Chat.Completions.New(idemretry.WithAction(bg, "chat:summary-8"), chatParams)
	require.Error(t, err)
	assert.Equal(t, 1, final.requests())
}

// Two tenants' identical chat completions at once through one Transport
// (a multi-tenant service), each openai-go client with its own API key:
// one request of one action by their fingerprint, but each must reach the
// server with its own key. The request with the revoked key waits for the
// other's flight, then goes as a request of its own, and is refused.
// (Issue 29: it joined the other tenant's flight and was given that
// tenant's completion, sending nothing.)
func TestFlightNotSharedAcrossCredentials(t *testing.T) {
	second := make(chan struct{})
	var mu sync.Mutex
	var auths []string
	srv := newWire(t, func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		if n == 1 {
			// Held until the other request arrived, or waits for this
			// one's flight (see TestSQSIdenticalCallsAtOnceEachSent).
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && !flightJoined(); time.Sleep(time.Millisecond) {
				select {
				case <-second:
				default:
					continue
				}
				break
			}
		} else if n == 2 {
			close(second)
		}
		if r.Header.Get("Authorization") == "Bearer sk-revoked" {
			write(w, http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`,
				"Content-Type", "application/json")
			return
		}
		write(w, http.StatusOK, chatCompletion(n), "Content-Type", "application/json")
	})
	tr, _ := newTransport(t, nil)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, key := range []string{"sk-tenant-a", "sk-revoked"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(key),
				option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
			_, errs[i] = c.Chat.Completions.New(bg, chatParams)
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("requests %d, Authorization %q, errors %v", srv.requests(), auths, errs)
	assert.NoError(t, errs[0])
	assert.ErrorContains(t, errs[1], "401", "the revoked key's own answer")
	assert.ElementsMatch(t, []string{"Bearer sk-tenant-a", "Bearer sk-revoked"}, auths, "each request with its own key")
}
