package idemretry

// This file reads what servers say about an answer beyond its status: retry
// hints, replay marks, and refusals of a key reused with another payload.
// DefaultRetryPolicy, IsReplay and KeyReuseRejected all ask it; the README's
// "Hints recognised" table lists every name with its source.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
)

// retryHeaders are the headers a server uses to say, whatever the status,
// whether a resend with the same key may succeed: "true" or "false".
// These names and replayHeaders' are canonical: each is looked up as
// written (h[name]), as net/http stores the headers it reads.
var retryHeaders = [...]string{
	"Stripe-Should-Retry", // Stripe; read by stripe-go, stripe-node, stripe-ruby
	"X-Should-Retry",      // OpenAI and Anthropic APIs; read by their SDKs
	"Transient-Error",     // Adyen, on idempotency errors
}

// replayHeaders are the headers a server sets to "true" on an answer it
// replays from its idempotency store instead of processing the request.
var replayHeaders = [...]string{
	"Idempotent-Replayed",    // Stripe, Whop, ePay
	"Idempotency-Replayed",   // server middlewares
	"X-Idempotency-Replayed", // fiskaly
	"Idempotency-Replay",     // Crunchy Data (Brandur Leach)
	"X-Idempotency-Replay",   // theculprit.ai
}

// retryHint returns what the retry headers say: retry is whether to retry,
// ok whether any of them said anything. When they disagree, "false" wins:
// a server that says a resend cannot succeed is never overridden. Every
// line of a header counts, as each is a hint of its own (a gateway may add
// one to the application's): "true" on one line and "false" on another
// is "false".
func retryHint(h http.Header) (retry, ok bool) {
	for _, name := range retryHeaders {
		if retry, ok = readRetryHints(h[name], retry, ok); ok && !retry {
			return false, true
		}
	}
	return retry, ok
}

// readRetryHints folds the values of one retry header, one per line, into
// what the others said (retry, ok), stopping at a "false".
func readRetryHints(vv []string, retry, ok bool) (bool, bool) {
	for _, v := range vv {
		if retry, ok = readRetryHint(v, retry, ok); ok && !retry {
			return false, true
		}
	}
	return retry, ok
}

// readRetryHint folds one retry header's value v into what the others
// said (retry, ok): "false" and "true" (case-insensitive, optionally
// quoted) are read, anything else changes nothing. A line a proxy folded
// from several (comma-separated, RFC 9110 section 5.3) counts as each.
func readRetryHint(v string, retry, ok bool) (bool, bool) {
	for more := true; more; {
		var e string
		e, v, more = strings.Cut(v, ",")
		switch strings.ToLower(unquote(e)) {
		case "false":
			return false, true
		case "true":
			retry, ok = true, true
		}
	}
	return retry, ok
}

// IsReplay reports whether the server says resp replays a stored answer to
// an earlier request with the same key: one of Idempotent-Replayed,
// Idempotency-Replayed, X-Idempotency-Replayed, Idempotency-Replay or
// X-Idempotency-Replay is "true" (case-insensitive, optionally quoted) on
// any of its lines. A replayed answer is final: the server will only
// replay it again.
func IsReplay(resp *http.Response) bool {
	if resp == nil {
		return false
	}
	for _, name := range replayHeaders {
		if saysTrue(resp.Header[name]) {
			return true
		}
	}
	return false
}

// saysTrue reports whether one of a header's lines is "true"
// (case-insensitive, optionally quoted), also within a line folded from
// several.
func saysTrue(vv []string) bool {
	for _, v := range vv {
		for more := true; more; {
			var e string
			e, v, more = strings.Cut(v, ",")
			if strings.EqualFold(unquote(e), "true") {
				return true
			}
		}
	}
	return false
}

// unquote trims v and the double quotes of a quoted string around it.
func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	return v
}

// maxPeek is the most of a response body KeyReuseRejected reads.
const maxPeek = 8 << 10

// KeyReuseRejected reports whether resp is the server's refusal of a key
// already used with another payload: an answer no resend with that key can
// change. It recognises, on a 400, 409 or 422:
//
//   - the IETF draft (draft-ietf-httpapi-idempotency-key-header, section
//     "Error Scenarios"): a 422 whose problem details (RFC 9457) or JSON
//     error speak of idempotency in their type, title, detail or code, or
//     whose Link header points to a rel="describedby" document about
//     idempotency; on any of the three statuses, the draft's title
//     "Idempotency-Key is already used";
//   - Stripe: an error of type "idempotency_error" on a 400 (Stripe answers
//     409 with code "idempotency_key_in_use" while the first request is in
//     flight: that one is not a refusal), or the message "Keys for
//     idempotent requests can only be used with the same parameters";
//   - PayPal: the error name or issue DUPLICATE_REQUEST_ID or
//     PAYPAL_REQUEST_ID_PREVIOUSLY_USED;
//   - the codes idempotency_key_reused and idempotency_key_mismatch, in
//     the problem type or title or in an error code, in any case and with
//     '-', '_' or ' ' between the words;
//   - the draft's title at the start of a free-text field of the common
//     JSON error shapes (message, error.message, detail, and JSON:API's
//     errors[].title and errors[].detail), more words allowed after it:
//     NestJS's {"statusCode":422,"message":"Idempotency-Key is already
//     used"} (@node-idempotency/nestjs). Free text that has the words
//     elsewhere is not a refusal: a validation message may quote input;
//   - express-idempotency: a 417 Expectation Failed to a request that sent
//     no Expect header (so not 417's own meaning), whose answer carries the
//     request's key back under the same header (a name ending in
//     Idempotency-Key), as that middleware sets it on every answer to a
//     keyed request. Its body, an HTML page, is not read.
//
// A bare 422 is not enough: many APIs (Adyen among them) answer 422 to any
// request they cannot validate. A 409 that says a request with the key is
// still in flight is not a refusal either: it is retried.
//
// To read a body it needs a JSON media type (application/json or a +json
// type such as application/problem+json); then KeyReuseRejected reads at
// most the first 8 KiB (decompressed for judging, if net/http left the body
// gzipped because the caller set its own Accept-Encoding; no other coding
// is decoded), and replaces resp.Body with a body that yields
// those bytes and then the rest, and whose Close closes the original: the
// caller still reads the whole body, once. A body larger than that is
// judged on the fields that fit. The read waits for the body as any reader
// of it would: a body that stalls, until the request's context ends. KeyReuseRejected is not safe for
// concurrent use with other readers of resp.Body; calling it again on the
// same response reads nothing more.
func KeyReuseRejected(resp *http.Response) bool {
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
	case http.StatusExpectationFailed:
		return keyEchoed(resp)
	default:
		return false
	}
	if resp.StatusCode == http.StatusUnprocessableEntity && linksToIdempotency(resp.Header) {
		return true
	}
	if !jsonMediaType(resp.Header.Get("Content-Type")) {
		return false
	}
	return keyReuseBody(resp.StatusCode, jsonFields(decoded(resp, peek(resp))))
}

// decoded returns the JSON text of a body's first bytes b: b itself, or,
// for a body the server gzipped and net/http left so (the caller asked for
// it with an Accept-Encoding of its own), what b decompresses to, at most
// maxPeek bytes. A body that says gzip but does not start as gzip is
// judged as it came; one with other or several codings is not decoded.
func decoded(resp *http.Response, b []byte) []byte {
	if resp.Uncompressed || !gzipEncoded(resp.Header) || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		return b
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	out, _ := io.ReadAll(io.LimitReader(zr, maxPeek)) // b may be cut short: what it holds
	return out
}

// gzipEncoded reports that a header's Content-Encoding is gzip alone.
func gzipEncoded(h http.Header) bool {
	v := h.Values("Content-Encoding")
	if len(v) != 1 {
		return false
	}
	e := strings.TrimSpace(v[0])
	return strings.EqualFold(e, "gzip") || strings.EqualFold(e, "x-gzip")
}

// keyReuseBody applies KeyReuseRejected's rules to the fields of a JSON
// error body.
func keyReuseBody(status int, f map[string][]string) bool {
	if f == nil {
		return false
	}
	var named []string
	for _, k := range [...]string{"type", "title", "code", "errorcode", "error", "error.type", "error.code", "name", "details.issue"} {
		named = append(named, f[k]...)
	}
	for _, v := range named {
		w := words(v)
		switch {
		case strings.Contains(w, reusedTitle), // the draft's title
			strings.Contains(w, "idempotency_key_reused"),
			strings.Contains(w, "idempotency_key_mismatch"),
			w == "duplicate_request_id", w == "paypal_request_id_previously_used":
			return true
		case status == http.StatusUnprocessableEntity && strings.Contains(w, "idempoten"):
			return true
		}
	}
	if status == http.StatusUnprocessableEntity {
		for _, v := range f["detail"] {
			if strings.Contains(strings.ToLower(v), "idempoten") {
				return true
			}
		}
	}
	for _, k := range [...]string{"error.message", "message"} {
		for _, v := range f[k] {
			if strings.Contains(words(v), "idempotent_requests_can_only_be_used_with_the_same_parameters") {
				return true
			}
		}
	}
	for _, k := range [...]string{"message", "error.message", "detail", "errors.title", "errors.detail"} {
		for _, v := range f[k] {
			if w := words(v); w == reusedTitle || strings.HasPrefix(w, reusedTitle+"_") {
				return true
			}
		}
	}
	if status == http.StatusBadRequest {
		for _, v := range f["error.type"] {
			if strings.EqualFold(v, "idempotency_error") && !hasFold(f["error.code"], "idempotency_key_in_use") {
				return true
			}
		}
	}
	return false
}

// reusedTitle is the IETF draft's title for a key reused with another
// payload, "Idempotency-Key is already used", as words gives it.
const reusedTitle = "idempotency_key_is_already_used"

// keyEchoed reports whether resp carries its request's idempotency key
// back (a request header whose name ends in Idempotency-Key, with one
// value, found among the answer's values of that header) to a request
// that sent no Expect header: express-idempotency's 417.
func keyEchoed(resp *http.Response) bool {
	req := resp.Request
	if req == nil || len(headerValues(req.Header, "Expect")) > 0 {
		return false
	}
	for k, vv := range req.Header {
		ck := http.CanonicalHeaderKey(k)
		if len(vv) != 1 || vv[0] == "" || !strings.HasSuffix(ck, "Idempotency-Key") {
			continue
		}
		for _, v := range resp.Header.Values(ck) {
			if v == vv[0] {
				return true
			}
		}
	}
	return false
}

// words lower-cases s and turns every run of characters other than letters
// and digits into one '_': "Idempotency-Key is already used" becomes
// "idempotency_key_is_already_used".
func words(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	sep := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if sep && b.Len() > 0 {
				b.WriteByte('_')
			}
			b.WriteRune(r)
			sep = false
		} else {
			sep = true
		}
	}
	return b.String()
}

func hasFold(vs []string, s string) bool {
	for _, v := range vs {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// linksToIdempotency reports whether a Link header points, with
// rel="describedby", to a document whose address speaks of idempotency:
// the draft's alternative to a problem details body.
func linksToIdempotency(h http.Header) bool {
	for _, v := range h.Values("Link") {
		for _, link := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(link, ">")
			if !ok || !strings.Contains(strings.ToLower(target), "idempoten") {
				continue
			}
			for _, p := range strings.Split(params, ";") {
				name, val, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(strings.TrimSpace(name), "rel") {
					for _, rel := range strings.Fields(unquote(val)) {
						if strings.EqualFold(rel, "describedby") {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// jsonMediaType reports whether a Content-Type is JSON: application/json
// or a structured +json type (application/problem+json).
func jsonMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// peekedBody is a response body whose first bytes were read to classify
// it: it yields prefix, then the rest of the original, and closes the
// original.
type peekedBody struct {
	io.Reader
	prefix []byte
	orig   io.Closer
}

func (p *peekedBody) Close() error { return p.orig.Close() }

// peek returns up to maxPeek bytes from the start of resp.Body, and leaves
// resp.Body yielding the whole body. A read error is kept for the caller,
// after the bytes read before it.
func peek(resp *http.Response) []byte {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	if p, ok := resp.Body.(*peekedBody); ok {
		return p.prefix
	}
	orig := resp.Body
	buf, err := io.ReadAll(io.LimitReader(orig, maxPeek))
	resp.Body = &peekedBody{Reader: io.MultiReader(bytes.NewReader(buf), errReader(err, orig)), prefix: buf, orig: orig}
	return buf
}

// jsonFields returns the string and number members of a JSON object, to
// two levels, keyed by their lower-cased dotted path ("error.code"; the
// objects of an array share its name: "details.issue"). b may be cut short:
// the members before the cut are returned. It returns nil if b does not
// start with an object.
func jsonFields(b []byte) map[string][]string {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	out := map[string][]string{}
	w := fieldWalker{dec: dec, out: out}
	w.object("", 1)
	return out
}

// fieldWalker walks a JSON object for jsonFields; its methods return false
// once the input ends or is malformed.
type fieldWalker struct {
	dec *json.Decoder
	out map[string][]string
}

const maxFieldDepth = 2

// object reads the members of an object whose '{' was read, and its '}'.
func (w *fieldWalker) object(path string, depth int) bool {
	for w.dec.More() {
		t, err := w.dec.Token()
		if err != nil {
			return false
		}
		key, ok := t.(string)
		if !ok {
			return false
		}
		key = strings.ToLower(key)
		if path != "" {
			key = path + "." + key
		}
		if !w.value(key, depth, false) {
			return false
		}
	}
	_, err := w.dec.Token()
	return err == nil
}

// value reads one value at path; the elements of an array are read at
// their array's path, and an array in an array is skipped.
func (w *fieldWalker) value(path string, depth int, inArray bool) bool {
	t, err := w.dec.Token()
	if err != nil {
		return false
	}
	switch t := t.(type) {
	case string:
		w.out[path] = append(w.out[path], t)
	case json.Number:
		w.out[path] = append(w.out[path], t.String())
	case json.Delim:
		switch {
		case t == '{' && depth < maxFieldDepth:
			return w.object(path, depth+1)
		case t == '[' && !inArray:
			for w.dec.More() {
				if !w.value(path, depth, true) {
					return false
				}
			}
			_, err := w.dec.Token()
			return err == nil
		default:
			return w.skip()
		}
	}
	return true
}

// skip reads the rest of an object or array whose opening was read.
func (w *fieldWalker) skip() bool {
	for n := 1; n > 0; {
		t, err := w.dec.Token()
		if err != nil {
			return false
		}
		if d, ok := t.(json.Delim); ok {
			switch d {
			case '{', '[':
				n++
			default:
				n--
			}
		}
	}
	return true
}
