package idemretry

import (
	"fmt"
	"net/http"
	"net/textproto"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemretry/idemretry/internal/httptoken"
)

// Headers is a list of HTTP header lines (name and value), in order. Names
// are matched without regard to case. Read every line with Len, Name(i) and
// Value(i); a new Headers (or the zero value) is empty.
type Headers struct {
	lines []headerLine
}

type headerLine struct{ name, value string }

// NewHeaders returns an empty list of headers.
func NewHeaders() *Headers { return &Headers{} }

// Set replaces every line named name with one line name: value.
func (h *Headers) Set(name, value string) {
	h.Remove(name)
	h.Add(name, value)
}

// Add appends the line name: value, keeping the lines already named name.
func (h *Headers) Add(name, value string) {
	h.lines = append(h.lines, headerLine{name: name, value: value})
}

// Get returns the value of the first line named name, or "" if there is
// none.
func (h *Headers) Get(name string) string {
	if h == nil {
		return ""
	}
	for _, l := range h.lines {
		if strings.EqualFold(l.name, name) {
			return l.value
		}
	}
	return ""
}

// Has reports whether a line is named name.
func (h *Headers) Has(name string) bool {
	if h == nil {
		return false
	}
	for _, l := range h.lines {
		if strings.EqualFold(l.name, name) {
			return true
		}
	}
	return false
}

// Remove removes every line named name.
func (h *Headers) Remove(name string) {
	kept := h.lines[:0]
	for _, l := range h.lines {
		if !strings.EqualFold(l.name, name) {
			kept = append(kept, l)
		}
	}
	clear(h.lines[len(kept):])
	h.lines = kept
}

// Len returns the number of lines.
func (h *Headers) Len() int32 {
	if h == nil {
		return 0
	}
	return int32(len(h.lines))
}

// Name returns the name of line i (0 to Len()-1), or "" if there is no
// such line.
func (h *Headers) Name(i int32) string {
	if h == nil || i < 0 || int(i) >= len(h.lines) {
		return ""
	}
	return h.lines[i].name
}

// Value returns the value of line i (0 to Len()-1), or "" if there is no
// such line.
func (h *Headers) Value(i int32) string {
	if h == nil || i < 0 || int(i) >= len(h.lines) {
		return ""
	}
	return h.lines[i].value
}

// check returns why the lines cannot be sent, or "": net/http sends none
// of them then, so the Send is refused before its action is journaled.
func (h *Headers) check() string {
	if h == nil {
		return ""
	}
	for _, l := range h.lines {
		if !httptoken.Valid(l.name) {
			return "header name " + quote(l.name) + " is not an HTTP token"
		}
		if i := invalidValueByte(l.value); i >= 0 {
			// Not the value itself: it may be a credential.
			return fmt.Sprintf("header %s has a control character (0x%02x) at byte %d of its value", quote(l.name), l.value[i], i)
		}
	}
	return ""
}

// invalidValueByte returns the index of the first byte of v for which
// net/http refuses to send v as a header value, or -1: a control character
// other than HTAB (CR, LF, NUL, ESC, DEL...). It is the rule of
// golang.org/x/net/http/httpguts.ValidHeaderFieldValue, which net/http's
// Transport checks every value against; names are checked by
// httptoken.Valid, which is httpguts.ValidHeaderFieldName's rule.
func invalidValueByte(v string) int {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return i
		}
	}
	return -1
}

// toHTTP returns the lines as an http.Header.
func (h *Headers) toHTTP() http.Header {
	out := make(http.Header)
	if h == nil {
		return out
	}
	for _, l := range h.lines {
		out.Add(l.name, l.value)
	}
	return out
}

// headersFrom returns the lines of hdr, sorted by name, each name's values
// in their order.
func headersFrom(hdr http.Header) *Headers {
	names := make([]string, 0, len(hdr))
	for name := range hdr {
		names = append(names, name)
	}
	sort.Strings(names)
	h := &Headers{}
	for _, name := range names {
		for _, v := range hdr[name] {
			// HTTP allows bytes that are not UTF-8 (Latin-1): as Java
			// reads them (U+FFFD), and not as Objective-C would (no
			// string at all).
			h.lines = append(h.lines, headerLine{name: textproto.CanonicalMIMEHeaderKey(name), value: strings.ToValidUTF8(v, "\uFFFD")})
		}
	}
	return h
}

// Request is one HTTP request for Client.Send.
type Request struct {
	// Method is the HTTP method: "POST" for a payment.
	Method string
	// URL is the absolute http or https URL.
	URL string
	// Headers are sent as they are (a null Headers sends none besides
	// the Idempotency-Key the Client adds to POST and PATCH).
	Headers *Headers
	// Body is the request body (null or empty for none).
	Body []byte
	// ActionID names the thing the user meant to do once, such as
	// "pay:order-1001": every send with this id carries the same
	// Idempotency-Key, in this run and after a restart, for the key
	// window. Required for POST and PATCH (unless Headers carry an
	// Idempotency-Key of the app's own: never both, which is refused with
	// KindInvalidRequest, as the header would name another action, under
	// another key); made once per user intent (when
	// the checkout screen opens, say), never per tap or per send. It is
	// stored on the device: it must not carry personal data. Under 1 KB,
	// not starting with "key:" or "fp:".
	ActionID string
	// TimeoutMillis bounds the whole send, retries included; 0 means the
	// Client's default (Options.TimeoutMillis).
	TimeoutMillis int64
}

// NewRequest returns a request for method and url with empty Headers.
func NewRequest(method, url string) *Request {
	return &Request{Method: method, URL: url, Headers: NewHeaders()}
}

// Response is the server's final answer to a Send.
type Response struct {
	// Status is the HTTP status code.
	Status int32
	// Headers are the response's header lines, sorted by name.
	Headers *Headers
	// Body is the whole response body.
	Body []byte
	// Replayed is true when the server said (Idempotent-Replayed: true)
	// that this is its stored answer to an earlier send of the action,
	// as after a resend following a crash: the action was performed
	// once, earlier.
	Replayed bool
}

// quote returns s quoted as Go does (control characters and bytes that
// are not UTF-8 escaped), cut to 64 bytes (at a character's start).
func quote(s string) string {
	if len(s) > 64 {
		n := 64
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "..."
	}
	return strconv.Quote(s) // control characters escaped: a message is for logs
}
