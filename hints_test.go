package idemretry_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
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

// sendAlways sends one POST through a Transport allowing two retries, to a
// server that always answers with a, and returns the response and the
// number of requests the server saw.
func sendAlways(t *testing.T, a func(http.ResponseWriter)) (*http.Response, int, error) {
	t.Helper()
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool { a(w); return true }
	tr, _, _ := newTestTransport(t, idemretry.WithMaxRetries(2), idemretry.WithBackOff(constant(time.Millisecond)))
	resp, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:hint"), srv.URL, `{"amount":100}`))
	return resp, len(srv.seen()), err
}

// Each retry hint, alone, changes exactly what it says: "true" retries a
// status that is otherwise final, "false" ends one that is otherwise
// retried, and any other value leaves the status rule alone.
func TestHintHeadersOverrideStatus(t *testing.T) {
	for _, h := range []string{"Stripe-Should-Retry", "X-Should-Retry", "Transient-Error"} {
		cases := []struct {
			name     string
			status   int
			value    string
			attempts int
		}{
			{"true retries a 400", 400, "true", 3},
			{"TRUE retries a 422", 422, " TRUE ", 3},
			{"false ends a 503", 503, "false", 1},
			{"false ends a 409", 409, "False", 1},
			{"false ends a 429", 429, "false", 1},
			{"true keeps a 500 retried", 500, "true", 3},
			{"false keeps a 400 final", 400, "false", 1},
			{"other value: 503 still retried", 503, "maybe", 3},
			{"other value: 400 still final", 400, "1", 1},
		}
		for _, c := range cases {
			t.Run(h+"/"+c.name, func(t *testing.T) {
				resp, n, err := sendAlways(t, answer(c.status, "no", h, c.value))
				require.NoError(t, err)
				assert.Equal(t, c.status, resp.StatusCode)
				assert.Equal(t, "no", readAll(t, resp))
				assert.Equal(t, c.attempts, n)
			})
		}
	}
}

// When hints disagree, "false" wins, whichever header says it.
func TestHintPrecedenceFalseWins(t *testing.T) {
	cases := []struct {
		name   string
		status int
		hdr    []string
	}{
		{"X-Should-Retry false over Stripe true", 400, []string{"Stripe-Should-Retry", "true", "X-Should-Retry", "false"}},
		{"Stripe false over Transient-Error true", 503, []string{"Stripe-Should-Retry", "false", "Transient-Error", "true"}},
		{"Transient-Error false over X-Should-Retry true", 503, []string{"X-Should-Retry", "true", "Transient-Error", "false"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, n, err := sendAlways(t, answer(c.status, "x", c.hdr...))
			require.NoError(t, err)
			readAll(t, resp)
			assert.Equal(t, 1, n)
		})
	}
	// Two agreeing hints retry.
	resp, n, err := sendAlways(t, answer(400, "x", "X-Should-Retry", "true", "Transient-Error", "true"))
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, 3, n)
}

// Every replay header, set to "true", makes a retryable answer final and
// is seen by IsReplay on the response returned; "false" changes nothing.
// A replay is final even when a hint says to retry.
func TestReplayHeadersAreFinal(t *testing.T) {
	for _, h := range []string{"Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotency-Replayed", "Idempotency-Replay", "X-Idempotency-Replay"} {
		t.Run(h, func(t *testing.T) {
			resp, n, err := sendAlways(t, answer(500, "stored", h, "true"))
			require.NoError(t, err)
			assert.True(t, idemretry.IsReplay(resp))
			assert.Equal(t, "stored", readAll(t, resp))
			assert.Equal(t, 1, n)

			resp, n, err = sendAlways(t, answer(500, "fresh", h, "false"))
			require.NoError(t, err)
			assert.False(t, idemretry.IsReplay(resp))
			readAll(t, resp)
			assert.Equal(t, 3, n)

			resp, n, err = sendAlways(t, answer(503, "stored", h, `"true"`, "Stripe-Should-Retry", "true", "X-Should-Retry", "true"))
			require.NoError(t, err)
			assert.True(t, idemretry.IsReplay(resp))
			readAll(t, resp)
			assert.Equal(t, 1, n)
		})
	}
}

// Answers that refuse a key used before with another payload, as servers
// send them.
var keyReuseAnswers = []struct {
	name   string
	status int
	ctype  string
	body   string
	hdr    []string
}{
	{"IETF draft 422 problem", 422, "application/problem+json",
		`{"type":"https://developer.example.com/idempotency","title":"Idempotency-Key is already used","detail":"Idempotency Key MUST not be reused across different payloads of this operation."}`, nil},
	{"IETF draft 422 Link", 422, "text/html", "<p>see the documentation</p>",
		[]string{"Link", `<https://developer.example.com/idempotency>; rel="describedby"; type="text/html"`}},
	{"IETF title on a 409", 409, "application/problem+json", `{"type":"about:blank","title":"Idempotency-Key is already used"}`, nil},
	{"Stripe 400 idempotency_error", 400, "application/json",
		`{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than 'k' if you meant to execute a different request."}}`, nil},
	{"Stripe message with a retry hint", 400, "application/json; charset=utf-8",
		`{"error":{"message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`,
		[]string{"Stripe-Should-Retry", "true"}},
	{"PayPal v1 DUPLICATE_REQUEST_ID", 400, "application/json",
		`{"name":"DUPLICATE_REQUEST_ID","message":"The value of PayPal-Request-Id header has already been used","debug_id":"abc"}`, nil},
	{"PayPal v3 issue", 422, "application/json",
		`{"name":"UNPROCESSABLE_ENTITY","details":[{"field":"","issue":"PAYPAL_REQUEST_ID_PREVIOUSLY_USED","description":"The PayPal-Request-ID has already been used for another request."}]}`, nil},
	{"idempotency_key_reused code on a 409", 409, "application/json",
		`{"error":{"code":"IDEMPOTENCY_KEY_REUSED","type":"IDEMPOTENCY_ERROR","message":"Idempotency Key Reused"}}`,
		[]string{"X-Should-Retry", "true"}},
	{"idempotency-key-reused problem type", 422, "application/problem+json",
		`{"code":"idempotency_key_reused","status":422,"title":"Unprocessable Entity","type":"https://echo.labstack.com/pro/problems/idempotency-key-reused"}`, nil},
	{"idempotency_key_mismatch on a 400", 400, "application/json", `{"error":{"code":"idempotency_key_mismatch"}}`,
		[]string{"Transient-Error", "true"}},
}

// A payload-mismatch answer is never retried, whatever its status and
// hints: the server sees one request. The caller gets either the answer,
// its body whole and recognised by KeyReuseRejected, or an error that is
// ErrKeyReused.
func TestKeyReuseNeverRetried(t *testing.T) {
	for _, c := range keyReuseAnswers {
		t.Run(c.name, func(t *testing.T) {
			resp, n, err := sendAlways(t, answer(c.status, c.body, append([]string{"Content-Type", c.ctype}, c.hdr...)...))
			assert.Equal(t, 1, n, "a payload mismatch must not be resent")
			if err != nil {
				require.ErrorIs(t, err, idemretry.ErrKeyReused)
				return
			}
			assert.Equal(t, c.status, resp.StatusCode)
			assert.True(t, idemretry.KeyReuseRejected(resp))
			assert.Equal(t, c.body, readAll(t, resp))
		})
	}
}

// The IETF draft's 409 "a request is outstanding" is retried with the same
// key until the original is done, and so is Stripe's
// idempotency_key_in_use: neither is a payload mismatch.
func TestInFlightConflictRetried(t *testing.T) {
	cases := []struct {
		name string
		a    func(http.ResponseWriter)
	}{
		{"IETF draft", answer(409,
			`{"type":"https://developer.example.com/idempotency","title":"A request is outstanding for this Idempotency-Key","detail":"A request with the same Idempotency-Key for the same operation is being processed or is outstanding."}`,
			"Content-Type", "application/problem+json")},
		{"Stripe", answer(409,
			`{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): k. Please try again later."}}`,
			"Content-Type", "application/json")},
		{"Sinch", answer(409,
			`{"type":"https://developers.sinch.com/docs/errors/registry/idempotency-conflict","title":"Idempotency Conflict","detail":"A request with Idempotency-Key k is still being processed. Retry later with the same key."}`,
			"Content-Type", "application/problem+json")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newPayServer(t)
			srv.script = scriptFirst(c.a, c.a)
			tr, _, _ := newTestTransport(t, idemretry.WithBackOff(constant(time.Millisecond)))
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, `{"charge":"ch_1"}`, readAll(t, resp))
			srv.requireOnePayment(t, 3)
		})
	}
}

// KeyReuseRejected over real HTTP: it recognises the answer, the caller
// still reads the whole body, also one far larger than what is peeked, and
// closing it returns the connection for reuse.
func TestKeyReuseRejectedKeepsBodyOverHTTP(t *testing.T) {
	t.Parallel()
	big := `{"title":"Idempotency-Key is already used","type":"https://developer.example.com/idempotency","detail":"` +
		strings.Repeat("x", 100<<10) + `"}`
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		answer(422, big, "Content-Type", "application/problem+json")(w)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		resp, err := (&http.Client{Transport: base}).Post(srv.URL, "application/json", strings.NewReader("x"))
		require.NoError(t, err)
		assert.True(t, idemretry.KeyReuseRejected(resp))
		assert.True(t, idemretry.KeyReuseRejected(resp), "a second call reads nothing more and agrees")
		assert.Equal(t, big, readAll(t, resp))
	}
	assert.EqualValues(t, 1, conns.Load(), "each body was read whole and closed, so the connection was reused")
}

// countingBody counts the bytes read from it and whether it was closed.
type countingBody struct {
	r      io.Reader
	n      int
	closed bool
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func (c *countingBody) Close() error { c.closed = true; return nil }

func response(status int, ctype, body string, hdr ...string) (*http.Response, *countingBody) {
	b := &countingBody{r: strings.NewReader(body)}
	resp := &http.Response{StatusCode: status, Header: http.Header{}, Body: b}
	if ctype != "" {
		resp.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		resp.Header.Add(hdr[i], hdr[i+1])
	}
	return resp, b
}

// The classifier's table: what is a payload-mismatch refusal and what is
// not, and what each verdict costs the body.
func TestKeyReuseRejectedTable(t *testing.T) {
	t.Parallel()
	for _, c := range keyReuseAnswers {
		t.Run("yes/"+c.name, func(t *testing.T) {
			resp, _ := response(c.status, c.ctype, c.body, c.hdr...)
			assert.True(t, idemretry.KeyReuseRejected(resp))
			assert.Equal(t, c.body, readAll(t, resp))
		})
	}
	no := []struct {
		name   string
		status int
		ctype  string
		body   string
		hdr    []string
	}{
		{"bare 422", 422, "", "", nil},
		{"Adyen validation 422", 422, "application/problem+json",
			`{"type":"https://docs.adyen.com/errors/validation","title":"The request is missing required fields or contains invalid data.","status":422,"detail":"It is mandatory to specify a legally-binding payment amount.","errorCode":"14_030"}`, nil},
		{"Adyen 704 in flight", 409, "application/json",
			`{"status":409,"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}`, nil},
		{"draft 409 outstanding", 409, "application/problem+json",
			`{"type":"https://developer.example.com/idempotency","title":"A request is outstanding for this Idempotency-Key"}`, nil},
		{"draft 400 key missing", 400, "application/problem+json",
			`{"type":"https://developer.example.com/idempotency","title":"Idempotency-Key is missing"}`, nil},
		{"Stripe 409 in use", 409, "application/json",
			`{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key."}}`, nil},
		{"Stripe 400 in use", 400, "application/json",
			`{"error":{"type":"idempotency_error","code":"idempotency_key_in_use"}}`, nil},
		{"Stripe invalid request", 400, "application/json",
			`{"error":{"type":"invalid_request_error","code":"parameter_missing","param":"amount"}}`, nil},
		{"mismatch text but not JSON", 409, "text/plain", "idempotency_key_reused", nil},
		{"mismatch code on a 500", 500, "application/json", `{"code":"idempotency_key_reused"}`, nil},
		{"mismatch code on a 200", 200, "application/json", `{"code":"idempotency_key_reused"}`, nil},
		{"Link on a 409", 409, "", "", []string{"Link", `<https://developer.example.com/idempotency>; rel="describedby"`}},
		{"Link to another document", 422, "", "", []string{"Link", `<https://developer.example.com/validation>; rel="describedby"`}},
		{"Link to idempotency but another rel", 422, "", "", []string{"Link", `<https://developer.example.com/idempotency>; rel="help"`}},
		{"mismatch code past the first 8 KiB", 409, "application/json",
			`{"detail":"` + strings.Repeat("y", 9000) + `","code":"idempotency_key_reused"}`, nil},
		{"JSON not an object", 409, "application/json", `["idempotency_key_reused"]`, nil},
		{"malformed JSON", 409, "application/json", `{"code" "idempotency_key_reused"}`, nil},
		{"mismatch code nested too deep", 409, "application/json", `{"a":{"b":{"code":"idempotency_key_reused"}}}`, nil},
		{"bad media type", 409, "application/json; =", `{"code":"idempotency_key_reused"}`, nil},
	}
	for _, c := range no {
		t.Run("no/"+c.name, func(t *testing.T) {
			resp, _ := response(c.status, c.ctype, c.body, c.hdr...)
			assert.False(t, idemretry.KeyReuseRejected(resp))
			assert.Equal(t, c.body, readAll(t, resp))
		})
	}
	assert.False(t, idemretry.KeyReuseRejected(nil))
	assert.False(t, idemretry.KeyReuseRejected(&http.Response{StatusCode: 422, Header: http.Header{"Content-Type": {"application/json"}}}), "no body")
	assert.False(t, idemretry.KeyReuseRejected(&http.Response{StatusCode: 422, Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody}))
}

// KeyReuseRejected reads no body it cannot judge, at most 8 KiB of one it
// can, and its replacement body yields every byte, passes on a read error
// after the bytes before it, and closes the original.
func TestKeyReuseRejectedPeekBounds(t *testing.T) {
	t.Parallel()
	resp, b := response(409, "text/plain", "idempotency_key_reused")
	assert.False(t, idemretry.KeyReuseRejected(resp))
	assert.Zero(t, b.n, "a body that is not JSON is not read")
	assert.Same(t, b, resp.Body, "nor replaced")

	resp, b = response(503, "application/json", `{"code":"idempotency_key_reused"}`)
	assert.False(t, idemretry.KeyReuseRejected(resp))
	assert.Zero(t, b.n, "a status that cannot be a refusal is not read")

	body := `{"detail":"` + strings.Repeat("z", 64<<10) + `"}`
	resp, b = response(409, "application/json", body)
	assert.False(t, idemretry.KeyReuseRejected(resp))
	assert.Equal(t, 8<<10, b.n, "at most 8 KiB is read to judge")
	assert.False(t, idemretry.KeyReuseRejected(resp))
	assert.Equal(t, 8<<10, b.n, "a second call reads nothing more")
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, body, string(got))
	assert.False(t, b.closed)
	require.NoError(t, resp.Body.Close())
	assert.True(t, b.closed, "closing the replacement closes the original")

	// A body that fails after 10 bytes: the caller reads those, then the error.
	boom := errors.New("connection reset")
	resp = &http.Response{StatusCode: 409, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(io.MultiReader(strings.NewReader(`{"code":"i`), &failing{boom}))}
	assert.False(t, idemretry.KeyReuseRejected(resp))
	got, err = io.ReadAll(resp.Body)
	assert.Equal(t, `{"code":"i`, string(got))
	assert.ErrorIs(t, err, boom)
}

type failing struct{ err error }

func (f *failing) Read([]byte) (int, error) { return 0, f.err }

// IsReplay's table.
func TestIsReplayTable(t *testing.T) {
	t.Parallel()
	yes := [][]string{
		{"Idempotent-Replayed", "true"}, {"idempotent-replayed", "TRUE"}, {"Idempotency-Replayed", " true "},
		{"X-Idempotency-Replayed", `"true"`}, {"Idempotency-Replay", "True"}, {"X-Idempotency-Replay", "true"},
	}
	for _, h := range yes {
		resp, _ := response(200, "", "", h...)
		assert.True(t, idemretry.IsReplay(resp), "%q", h)
	}
	no := [][]string{
		{"Idempotent-Replayed", "false"}, {"X-Idempotency-Replayed", `"false"`}, {"Idempotency-Replay", "1"},
		{"Idempotent-Replayed", ""}, {"X-Idempotent-Replayed-Not", "true"}, {"Idempotent-Replayed", `"true`},
	}
	for _, h := range no {
		resp, _ := response(200, "", "", h...)
		assert.False(t, idemretry.IsReplay(resp), "%q", h)
	}
	assert.False(t, idemretry.IsReplay(nil))
}

// DefaultRetryPolicy's table, over the hints, replays and refusals alone.
func TestDefaultPolicyHintTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name   string
		status int
		ctype  string
		body   string
		hdr    []string
		retry  bool
	}{
		{"503", 503, "", "", nil, true},
		{"400", 400, "", "", nil, false},
		{"X-Should-Retry true on 400", 400, "", "", []string{"X-Should-Retry", "true"}, true},
		{"Transient-Error false on 503", 503, "", "", []string{"Transient-Error", "false"}, false},
		{"Transient-Error true on 409", 409, "", "", []string{"Transient-Error", "true"}, true},
		{"replay beats true", 503, "", "", []string{"Idempotency-Replayed", "true", "X-Should-Retry", "true"}, false},
		{"mismatch beats true", 409, "application/json", `{"code":"idempotency_key_mismatch"}`, []string{"Stripe-Should-Retry", "true"}, false},
		{"mismatch on 409", 409, "application/problem+json", `{"title":"Idempotency-Key is already used"}`, nil, false},
		{"in flight 409", 409, "application/problem+json", `{"title":"A request is outstanding for this Idempotency-Key"}`, nil, true},
		{"422 draft", 422, "application/problem+json", `{"title":"Idempotency-Key is already used"}`, nil, false},
	}
	for _, c := range cases {
		resp, _ := response(c.status, c.ctype, c.body, c.hdr...)
		assert.Equal(t, c.retry, idemretry.DefaultRetryPolicy(ctx, resp, nil), c.name)
		assert.Equal(t, c.body, readAll(t, resp), c.name)
	}
}

// A 400 with a JSON body is final by its status: the policy does not read
// it (a refusal it would find changes nothing).
func TestDefaultPolicyReadsOnlyToVeto(t *testing.T) {
	t.Parallel()
	resp, b := response(400, "application/json", `{"error":{"type":"idempotency_error"}}`)
	assert.False(t, idemretry.DefaultRetryPolicy(context.Background(), resp, nil))
	assert.Zero(t, b.n)
	assert.Same(t, b, resp.Body)
}

// A resend of an action refused as reused sends nothing and is refused
// as outcome-unknown.
func TestKeyReusedResendRefused(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(422)
			w.Write([]byte(`{"title":"Idempotency-Key is already used"}`))
			return true
		}
		return false
	}
	tr, _, _ := newTestTransport(t)
	ctx := idemretry.WithAction(context.Background(), "pay:R")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"a":1}`))
	require.ErrorIs(t, err, idemretry.ErrKeyReused)
	_, err = tr.RoundTrip(post(t, ctx, srv.URL, `{"a":1}`))
	t.Logf("resend: %v; requests=%d", err, len(srv.seen()))
	require.Len(t, srv.seen(), 1)
	require.True(t, errors.Is(err, idemretry.ErrOutcomeUnknown), "resend refused with %v", err)
}

// The IETF draft's title for a key reused with another payload,
// "Idempotency-Key is already used", is recognised as the start of the
// free-text fields of the common JSON error shapes too (message, error,
// error.message, detail, JSON:API's errors[].title and errors[].detail),
// not only in a problem's title: NestJS sends its HttpException's
// {"statusCode":422,"message":"Idempotency-Key is already used"}
// (@node-idempotency/nestjs), and servers add words after it. Free text
// that merely mentions the words, or a field the server echoes, is not a
// refusal.
func TestKeyReuseRejectedInCommonErrorShapes(t *testing.T) {
	t.Parallel()
	const ctype = "application/json; charset=utf-8"
	yes := []struct {
		name   string
		status int
		body   string
	}{
		{"NestJS 422 message", 422, `{"statusCode":422,"message":"Idempotency-Key is already used"}`},
		{"NestJS 422 message list", 422, `{"statusCode":422,"message":["Idempotency-Key is already used"],"error":"Unprocessable Entity"}`},
		{"409 message with more words", 409, `{"message":"Idempotency-Key is already used for a different request","code":"idempotency_key_conflict"}`},
		{"400 error string", 400, `{"error":"Idempotency key is already used."}`},
		{"error.message", 409, `{"error":{"message":"Idempotency-Key is already used with another payload"}}`},
		{"detail on a 400", 400, `{"detail":"Idempotency-Key is already used"}`},
		{"JSON:API errors title", 422, `{"errors":[{"status":"422","title":"Idempotency-Key is already used"}]}`},
		{"JSON:API errors detail", 409, `{"errors":[{"detail":"Idempotency-Key is already used for another order"}]}`},
	}
	for _, c := range yes {
		t.Run("yes/"+c.name, func(t *testing.T) {
			resp, _ := response(c.status, ctype, c.body)
			assert.True(t, idemretry.KeyReuseRejected(resp))
			assert.Equal(t, c.body, readAll(t, resp))
		})
	}
	no := []struct {
		name   string
		status int
		body   string
	}{
		{"validation message quoting the words", 422, `{"statusCode":422,"message":"description must not be 'Idempotency-Key is already used'"}`},
		{"the words in an echoed field", 422, `{"statusCode":422,"message":"amount must be positive","input":{"message":"Idempotency-Key is already used"}}`},
		{"a DTO field named for the key", 422, `{"statusCode":422,"message":["idempotencyKey must be a UUID"],"error":"Unprocessable Entity"}`},
		{"the draft's 409 outstanding as a message", 409, `{"statusCode":409,"message":"A request is outstanding for this Idempotency-Key"}`},
		{"the draft's 400 missing as a message", 400, `{"statusCode":400,"message":"Idempotency-Key is missing"}`},
		{"the words past the first 8 KiB", 422, `{"statusCode":422,"pad":"` + strings.Repeat("p", 9000) + `","message":"Idempotency-Key is already used"}`},
		{"malformed JSON", 422, `{"statusCode":422,"message" "Idempotency-Key is already used"}`},
		{"the words on a 500", 500, `{"statusCode":500,"message":"Idempotency-Key is already used"}`},
	}
	for _, c := range no {
		t.Run("no/"+c.name, func(t *testing.T) {
			resp, _ := response(c.status, ctype, c.body)
			assert.False(t, idemretry.KeyReuseRejected(resp))
			assert.Equal(t, c.body, readAll(t, resp))
		})
	}
}

// NestJS's refusal over real HTTP: one request, ErrKeyReused, and the
// action is outcome-unknown (not done with a final 422), so a resend sends
// nothing.
func TestKeyReuseNestJSRefusalIsOutcomeUnknown(t *testing.T) {
	srv := newPayServer(t)
	srv.script = func(n int, w http.ResponseWriter, r *http.Request) bool {
		answer(422, `{"statusCode":422,"message":"Idempotency-Key is already used"}`, "Content-Type", "application/json; charset=utf-8")(w)
		return true
	}
	tr, j, _ := newTestTransport(t, idemretry.WithBackOff(constant(time.Millisecond)))
	ctx := idemretry.WithAction(context.Background(), "pay:nest")
	err := sendErr(tr, post(t, ctx, srv.URL, `{"amount":100}`))
	require.ErrorIs(t, err, idemretry.ErrKeyReused)
	left, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, left, 1, "outcome-unknown, left for reconciliation")
	err = sendErr(tr, post(t, ctx, srv.URL, `{"amount":100}`))
	require.ErrorIs(t, err, idemretry.ErrOutcomeUnknown)
	assert.Len(t, srv.seen(), 1)
}

// express-idempotency (VilledeMontreal) refuses another payload under a key
// with 417 Expectation Failed through Express's HTML error page, having set
// the request's key on the answer. A 417 is recognised when the request
// sent no Expect header (417's own meaning) and the answer carries the
// request's key back under the same header; a 417 without the echo, or to
// a request that sent Expect, is an ordinary final answer.
func TestKeyReuseExpressIdempotency417(t *testing.T) {
	const page = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Error</title>\n</head>\n<body>\n<pre>Expectation Failed</pre>\n</body>\n</html>\n"
	express := func(echo bool) func(w http.ResponseWriter, r *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if k := r.Header.Get("Idempotency-Key"); echo && k != "" {
				w.Header().Set("Idempotency-Key", k)
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusExpectationFailed)
			io.WriteString(w, page)
		}
	}
	for _, c := range []struct {
		name   string
		echo   bool
		expect bool
		reused bool
	}{
		{"express-idempotency", true, false, true},
		{"417 without the key echoed", false, false, false},
		{"417 to a request that sent Expect", true, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var n atomic.Int32
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { n.Add(1); express(c.echo)(w, r) })
			tr, _, _ := newTestTransport(t, idemretry.WithBackOff(constant(time.Millisecond)))
			req := post(t, idemretry.WithAction(context.Background(), "pay:417"), srv.URL, `{"amount":1}`)
			if c.expect {
				req.Header.Set("Expect", "100-continue")
			}
			resp, err := tr.RoundTrip(req)
			assert.EqualValues(t, 1, n.Load(), "a 417 is final")
			if c.reused {
				require.ErrorIs(t, err, idemretry.ErrKeyReused)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, http.StatusExpectationFailed, resp.StatusCode)
			assert.Equal(t, page, readAll(t, resp))
		})
	}
}

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
	t.Parallel()
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
	t.Parallel()
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

// A proxy may fold a header's lines into one, comma-separated (RFC 9110,
// section 5.3): each element still counts as a line of its own. "false"
// folded with "true" ends a retryable answer; "true" folded with anything
// retries a final one; a folded replay mark is a replay.
func TestFoldedHintLinesCountEach(t *testing.T) {
	cases := []struct {
		name     string
		status   int
		hdr      []string
		attempts int
	}{
		{"false, true ends a 503", 503, []string{"X-Should-Retry", "false, true"}, 1},
		{"true,false ends a 503", 503, []string{"Stripe-Should-Retry", "true,false"}, 1},
		{"\"true\" , \"false\" ends a 409", 409, []string{"Transient-Error", `"true" , "false"`}, 1},
		{"true, maybe retries a 400", 400, []string{"X-Should-Retry", "true, maybe"}, 3},
		{"folded replay of a 503 is final", 503, []string{"Idempotent-Replayed", "true, true"}, 1},
		{"folded replay with an empty element", 503, []string{"Idempotency-Replayed", ", TRUE"}, 1},
		{"a value that only contains true retries as before", 503, []string{"Idempotent-Replayed", "untrue, truer"}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, n, err := sendAlways(t, answer(c.status, "x", c.hdr...))
			require.NoError(t, err)
			readAll(t, resp)
			assert.Equal(t, c.attempts, n)
		})
	}
	resp := &http.Response{StatusCode: 201, Header: http.Header{"X-Idempotency-Replay": {"false, true"}}}
	assert.True(t, idemretry.IsReplay(resp))
}

// A key refused as reused is still recognised with the default policy on
// each of the three statuses whose bodies it reads.
//
// Found in the review of the hot-path pass (2d31af3; was TestReviewKeyReuseRejectedWithDefaultPolicy).
func TestKeyReuseRejectedWithDefaultPolicy(t *testing.T) {
	for _, c := range []struct {
		code int
		body string
	}{
		{http.StatusBadRequest, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}`},
		{http.StatusConflict, `{"code":"idempotency_key_reused"}`},
		{http.StatusUnprocessableEntity, `{"type":"about:blank","title":"Idempotency-Key is already used"}`},
	} {
		t.Run(fmt.Sprint(c.code), func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				hits.Add(1)
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(c.code)
				io.WriteString(w, c.body)
			}))
			t.Cleanup(srv.Close)
			tr, _, _ := transportWithConstant(t)
			_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":4}`))
			require.ErrorIs(t, err, idemretry.ErrKeyReused)
			require.Equal(t, int32(1), hits.Load())
		})
	}
}

// Review hV2: the answer classification (hints.go, retry.go, run.classify)
// over real HTTP, with exact wire bytes where the header's shape matters.

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
// wins"), whichever line comes first and whatever the header's size. An
// empty line before "false" does not hide it. Over HTTP/1.1 exact bytes.
//
// Found in review hv2 (7ce9851; was TestHV2DuplicateRetryHintFalseWins).
func TestHintDuplicateRetryHintFalseWins(t *testing.T) {
	t.Parallel()
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
		// names.
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// hW3's review of KeyReuseRejected on a body net/http left gzip-encoded:
// over loopback, a bomb, several members, a body sent in pieces, and the
// caller's read of the bytes as they came.

// Found in review hw3 (ca18fb8; was TestHW3KeyReuseInGzipOverLoopback).
func TestKeyReuseInGzipOverLoopback(t *testing.T) {
	t.Parallel()
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
