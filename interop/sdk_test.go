package interop

// What an SDK's own retries cost when it sits above idemretry, measured at
// the server: requests per call to an endpoint that always answers 503, with
// each SDK's default retries and with the setting that turns them off.

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/go-resty/resty/v2"
	"github.com/openai/openai-go/v3"
	openaioption "github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemretry/idemretry"
)

// sdk is one SDK's call, made with its default retries or with them off.
type sdk struct {
	name string
	// unavailable is the SDK's service answering 503 in its own shape.
	unavailable func(int, http.ResponseWriter, *http.Request)
	call        func(ctx context.Context, url string, hc *http.Client, retriesOff bool) error
	// attempts is how many requests the SDK makes by default for a call
	// that keeps failing with 503.
	attempts int
}

// quiet503 answers the Stainless SDKs' services (OpenAI, Anthropic) 503
// with retry-after-ms: 1, which those SDKs honour and idemretry does not
// read, so that their own retries take a millisecond.
func stainless503(body string) func(int, http.ResponseWriter, *http.Request) {
	return always(http.StatusServiceUnavailable, body, "Content-Type", "application/json", "Retry-After-Ms", "1")
}

var sdks = []sdk{
	{
		name:        "stripe-go v82 (plain-text 503)",
		unavailable: always(http.StatusServiceUnavailable, "Service Unavailable\n", "Content-Type", "text/plain; charset=utf-8"),
		call: func(ctx context.Context, url string, hc *http.Client, off bool) error {
			retries := stripe.DefaultMaxNetworkRetries
			if off {
				retries = 0 // MaxNetworkRetries: 0
			}
			_, err := stripeClient(url, hc, retries).V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{
				Amount: stripe.Int64(100), Currency: stripe.String(stripe.CurrencyUSD)})
			return err
		},
		attempts: 3,
	},
	{
		name:        "openai-go v3",
		unavailable: stainless503(`{"error":{"message":"The server is overloaded.","type":"server_error","param":null,"code":null}}`),
		call: func(ctx context.Context, url string, hc *http.Client, off bool) error {
			opts := []openaioption.RequestOption{openaioption.WithBaseURL(url + "/v1/"), openaioption.WithAPIKey("sk-interop"), openaioption.WithHTTPClient(hc)}
			if off {
				opts = append(opts, openaioption.WithMaxRetries(0))
			}
			c := openai.NewClient(opts...)
			_, err := c.Chat.Completions.New(ctx, chatParams)
			return err
		},
		attempts: 3,
	},
	{
		name:        "anthropic-sdk-go v2",
		unavailable: stainless503(`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`),
		call: func(ctx context.Context, url string, hc *http.Client, off bool) error {
			opts := []anthropicoption.RequestOption{anthropicoption.WithBaseURL(url), anthropicoption.WithAPIKey("sk-ant-interop"), anthropicoption.WithHTTPClient(hc)}
			if off {
				opts = append(opts, anthropicoption.WithMaxRetries(0))
			}
			c := anthropic.NewClient(opts...)
			_, err := c.Messages.New(ctx, anthropic.MessageNewParams{
				Model: anthropic.Model("claude-interop"), MaxTokens: 16,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
			return err
		},
		attempts: 3,
	},
	{
		name: "aws-sdk-go-v2 (SQS SendMessage)",
		unavailable: always(http.StatusServiceUnavailable, `{"__type":"com.amazonaws.sqs#ServiceUnavailable","message":"Service is unavailable"}`,
			"Content-Type", "application/x-amz-json-1.0"),
		call: func(ctx context.Context, url string, hc *http.Client, off bool) error {
			attempts := retry.DefaultMaxAttempts
			if off {
				attempts = 1 // a retryer with one attempt
			}
			_, err := sqsClient(url, hc, attempts).SendMessage(ctx, &sqs.SendMessageInput{
				QueueUrl: aws.String(url + "/000000000000/orders"), MessageBody: aws.String(`{"order":"A-1"}`)})
			return err
		},
		attempts: 3,
	},
	{
		name:        "resty v2 (3 retries, retrying 5xx)",
		unavailable: always(http.StatusServiceUnavailable, "Service Unavailable\n", "Content-Type", "text/plain; charset=utf-8"),
		call: func(ctx context.Context, url string, hc *http.Client, off bool) error {
			rc := resty.NewWithClient(hc).SetRetryCount(3).SetRetryWaitTime(time.Millisecond).SetRetryMaxWaitTime(time.Millisecond).
				AddRetryCondition(func(r *resty.Response, err error) bool { return err != nil || r.StatusCode() >= 500 })
			if off {
				rc.SetRetryCount(0)
			}
			resp, err := rc.R().SetContext(ctx).SetHeader("Content-Type", "application/json").SetBody(`{"amount":100}`).Post(url + "/payments")
			if err == nil && resp.IsError() {
				err = fmt.Errorf("resty: %s", resp.Status())
			}
			return err
		},
		attempts: 4,
	},
}

var chatParams = openai.ChatCompletionNewParams{
	Model:    openai.ChatModel("gpt-interop"),
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
}

// stripeClient is a stripe-go client of the server at url, over hc, with
// retries network retries and no logging.
func stripeClient(url string, hc *http.Client, retries int64) *stripe.Client {
	b := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient: hc, URL: stripe.String(url), MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test_interop", stripe.WithBackends(b))
}

// sqsClient is an SQS client of the server at url, over hc, whose standard
// retryer makes at most attempts attempts and waits nothing between them.
func sqsClient(url string, hc *http.Client, attempts int) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDINTEROP", SecretAccessKey: "secret"}, nil
		}),
		HTTPClient: hc,
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = attempts
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		}),
		DisableMessageChecksumValidation: true,
	})
}

// Every SDK above idemretry multiplies its attempts by idemretry's six: 18
// requests for one always-503 call (24 for resty with 3 retries), 6 with the
// SDK's retries off. With idemretry's retry budget on (the default), the
// budget parks the action once its 10 tokens are spent, the SDK retries the
// ErrParked error, and each of those later attempts is one request: 13, or
// 14 for resty. Every request of the call carries one key.
func TestSDKRetriesMultiply(t *testing.T) {
	for _, s := range sdks {
		t.Run(s.name, func(t *testing.T) {
			for _, c := range []struct {
				off, budget bool
				want        int
			}{
				{false, false, s.attempts * 6},
				{true, false, 6},
				{false, true, 6 + 6 + (s.attempts - 2)},
				{true, true, 6},
			} {
				srv := newWire(t, s.unavailable)
				opts := []idemretry.Option{idemretry.WithBackOff(noWait)}
				if !c.budget {
					opts = append(opts, idemretry.WithRetryBudget(0, 0))
				}
				tr, _ := newTransport(t, nil, opts...)
				err := s.call(bg, srv.URL, &http.Client{Transport: tr}, c.off)
				require.Error(t, err)
				t.Logf("%-34s SDK retries %-3s budget %-3s: %2d requests (%v)", s.name, onOff(!c.off), onOff(c.budget), srv.requests(), firstLine(err))
				assert.Equal(t, c.want, srv.requests(), "SDK retries off=%v, budget=%v", c.off, c.budget)
				assert.Len(t, unique(srv.seenKeys()), 1, "one key for every request of the call")
			}
		})
	}
}

// The SDKs alone (no idemretry) against the same endpoints: the baseline
// the products above are made of.
func TestSDKAttemptsAlone(t *testing.T) {
	for _, s := range sdks {
		t.Run(s.name, func(t *testing.T) {
			srv := newWire(t, s.unavailable)
			hc := &http.Client{Transport: &http.Transport{}}
			defer hc.CloseIdleConnections()
			require.Error(t, s.call(bg, srv.URL, hc, false))
			assert.Equal(t, s.attempts, srv.requests())
			srv2 := newWire(t, s.unavailable)
			require.Error(t, s.call(bg, srv2.URL, hc, true))
			assert.Equal(t, 1, srv2.requests(), "the setting turns the SDK's retries off")
		})
	}
}

// aws-sdk-go-v2 sends every call as a POST, so over idemretry each is a
// keyed action, and two identical unnamed calls at once (two SendMessage
// of one body, from two goroutines) are one action by their fingerprint.
// Each is signed with its own amz-sdk-invocation-id, so their
// Authorization headers differ: neither is given the other's answer, and
// both messages are sent, each with its own MessageId; so too named one
// action each, or through a Transport that takes the key off POST. (Issue
// 29: before flights compared askers, the second joined the first's flight:
// one request, and both callers were told their message was sent, with one
// MessageId.)
func TestSQSIdenticalCallsAtOnceEachSent(t *testing.T) {
	cases := []struct {
		name  string
		opts  []idemretry.Option
		named bool
	}{
		{"unnamed", nil, false},
		{"each call named", nil, true},
		{"WithUnkeyedMethods(POST)", []idemretry.Option{idemretry.WithUnkeyedMethods(http.MethodPost)}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			second := make(chan struct{})
			srv := newWire(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					// Held until the other call has sent its own request,
					// or waits for this one's flight (no timing: its
					// goroutine is seen waiting), at most 10 s.
					for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && !flightJoined(); time.Sleep(time.Millisecond) {
						select {
						case <-second:
						default:
							continue
						}
						break
					}
				} else {
					close(second)
				}
				write(w, http.StatusOK, fmt.Sprintf(`{"MD5OfMessageBody":"x","MessageId":"m-%d"}`, n), "Content-Type", "application/x-amz-json-1.0")
			})
			tr, _ := newTransport(t, nil, c.opts...)
			sq := sqsClient(srv.URL, &http.Client{Transport: tr}, 1)
			var wg sync.WaitGroup
			ids := make([]string, 2)
			for i := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := bg
					if c.named {
						ctx = idemretry.WithAction(bg, fmt.Sprintf("event:%d", i))
					}
					out, err := sq.SendMessage(ctx, &sqs.SendMessageInput{
						QueueUrl: aws.String(srv.URL + "/000000000000/events"), MessageBody: aws.String(`{"event":"tick"}`)})
					if assert.NoError(t, err) {
						ids[i] = aws.ToString(out.MessageId)
					}
				}()
			}
			wg.Wait()
			t.Logf("%s: %d requests, message ids %q", c.name, srv.requests(), ids)
			assert.Equal(t, 2, srv.requests())
			assert.Len(t, unique(ids), 2, "two messages, two MessageIds")
		})
	}
}

// flightJoined reports whether a goroutine of this process waits for an
// idemretry flight it joined.
func flightJoined() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "idemretry.(*flights).wait")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	if len(s) > 90 {
		s = s[:90] + "..."
	}
	return s
}

func unique(keys []string) map[string]bool {
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}
