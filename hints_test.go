package idemretry_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// answer writes a status with headers (name, value pairs) and a body.
func answer(code int, body string, hdr ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

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
