package idemretry

import (
	"errors"
	"math"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"
)

// Fuzz targets for every parser of outside input in this package: the
// server's Retry-After header, the caller's Idempotency-Key header, and the
// caller's action ids. (The request fingerprint parses nothing: it hashes
// the method, the URL's serialised form and the body's bytes.) Each checks
// properties against an oracle written from the specification, not only
// that nothing panics. Run one with, for example,
//
//	go test -run '^$' -fuzz '^FuzzRetryAfter$' -fuzztime 20s .

// fuzzWantPrefixOnce checks the "idemretry: " prefix appears at the start of an
// error's text, once.
func fuzzWantPrefixOnce(t *testing.T, err error) {
	t.Helper()
	if s := err.Error(); !strings.HasPrefix(s, "idemretry: ") || strings.HasPrefix(s, "idemretry: idemretry: ") {
		t.Errorf("error %q: want the prefix \"idemretry: \" once", s)
	}
}

func fuzzRetryAfterResp(status int, v string) *http.Response {
	return &http.Response{StatusCode: status, Header: http.Header{"Retry-After": {v}}}
}

// fuzzDigitsOnly reports whether s is a non-empty run of ASCII digits: the
// delta-seconds form (RFC 9110, 10.2.3).
func fuzzDigitsOnly(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// fuzzDeltaSeconds is the oracle for delta-seconds: n seconds, or the longest
// Duration when n seconds do not fit in one.
func fuzzDeltaSeconds(n *big.Int) time.Duration {
	if n.Cmp(big.NewInt(math.MaxInt64/int64(time.Second))) > 0 {
		return math.MaxInt64
	}
	return time.Duration(n.Int64()) * time.Second
}

func FuzzRetryAfter(f *testing.F) {
	date := "Wed, 21 Oct 2015 07:28:00 GMT"
	dateUnix := time.Date(2015, 10, 21, 7, 28, 0, 0, time.UTC).Unix()
	for _, s := range []struct {
		v   string
		now int64
	}{
		{"120", 0}, {"0", 0}, {" 7 ", 0}, {"\t5\t", 0}, {"007", 0},
		{"-1", 0}, {"+5", 0}, {"1.5", 0}, {"1e3", 0}, {"0x10", 0}, {"5s", 0}, {"5 6", 0},
		{"٣", 0}, {"5\x00", 0}, {"", 0}, {"   ", 0}, {"soon", 0},
		{"9223372036", 0}, {"9223372037", 0}, {"18446744073709551616", 0},
		{"99999999999999999999999999999999999999", 0},
		{date, dateUnix - 30}, {date, dateUnix + 30}, {date, dateUnix},
		{"Wednesday, 21-Oct-15 07:28:00 GMT", dateUnix - 1},
		{"Wed Oct 21 07:28:00 2015", dateUnix - 1},
		{"Wed, 21 Oct 2015 07:28:00 UTC", dateUnix - 1},
		{"Thu, 21 Oct 2015 07:28:00 GMT", dateUnix - 1},
		{"Wed, 21 Oct 9999 23:59:59 GMT", math.MinInt32},
		{"Wed, 32 Oct 2015 07:28:00 GMT", 0},
	} {
		f.Add(s.v, s.now)
	}
	f.Fuzz(func(t *testing.T, v string, nowUnix int64) {
		now := time.Unix(nowUnix, 0)
		d, ok := RetryAfter(fuzzRetryAfterResp(http.StatusTooManyRequests, v), now)

		// Never negative; nothing asked means no wait.
		if d < 0 {
			t.Fatalf("RetryAfter(%q) = %v, negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("RetryAfter(%q) = %v, false: a wait with ok=false", v, d)
		}
		// Every error status reads the header as a 429 does; a status below
		// 400 asks nothing.
		for _, status := range []int{http.StatusServiceUnavailable, http.StatusConflict, http.StatusInternalServerError, http.StatusBadGateway} {
			if d2, ok2 := RetryAfter(fuzzRetryAfterResp(status, v), now); d2 != d || ok2 != ok {
				t.Fatalf("%d with %q: %v, %v; 429: %v, %v", status, v, d2, ok2, d, ok)
			}
		}
		for _, status := range []int{http.StatusOK, http.StatusTemporaryRedirect} {
			if d2, ok2 := RetryAfter(fuzzRetryAfterResp(status, v), now); d2 != 0 || ok2 {
				t.Fatalf("status %d with %q: %v, %v; want 0, false", status, v, d2, ok2)
			}
		}

		trimmed := strings.TrimSpace(v)
		if fuzzDigitsOnly(trimmed) {
			n, _ := new(big.Int).SetString(trimmed, 10)
			// Delta-seconds: exactly n seconds, saturating; now plays no part.
			if want := fuzzDeltaSeconds(n); !ok || d != want {
				t.Fatalf("RetryAfter(%q) = %v, %v; want %v, true", v, d, ok, want)
			}
			if d2, _ := RetryAfter(fuzzRetryAfterResp(http.StatusTooManyRequests, v), now.Add(time.Hour)); d2 != d {
				t.Fatalf("RetryAfter(%q) depends on now: %v then %v", v, d, d2)
			}
			// Monotone: one more second, or ten times as many, is no shorter.
			for _, more := range []string{new(big.Int).Add(n, big.NewInt(1)).String(), trimmed + "0"} {
				d2, ok2 := RetryAfter(fuzzRetryAfterResp(http.StatusTooManyRequests, more), now)
				if !ok2 || d2 < d {
					t.Fatalf("RetryAfter(%q) = %v but RetryAfter(%q) = %v, %v", v, d, more, d2, ok2)
				}
			}
			return
		}
		date, err := http.ParseTime(trimmed)
		if err != nil {
			// Neither delta-seconds nor an HTTP-date: garbage asks nothing.
			if ok {
				t.Fatalf("RetryAfter(%q) = %v, true; want false for a value that is neither delta-seconds nor an HTTP-date", v, d)
			}
			return
		}
		// An HTTP-date: the time from now until then, none if it has passed.
		want := max(date.Sub(now), 0)
		if !ok || d != want {
			t.Fatalf("RetryAfter(%q, %v) = %v, %v; want %v, true", v, now, d, ok, want)
		}
		for _, c := range []struct {
			now  time.Time
			want time.Duration
		}{{date.Add(-5 * time.Second), 5 * time.Second}, {date, 0}, {date.Add(time.Hour), 0}} {
			if d2, ok2 := RetryAfter(fuzzRetryAfterResp(http.StatusTooManyRequests, v), c.now); !ok2 || d2 != c.want {
				t.Fatalf("RetryAfter(%q, %v) = %v, %v; want %v, true", v, c.now, d2, ok2, c.want)
			}
		}
	})
}

// fuzzValidKey is the specification of an accepted key: 1 to journal.MaxKeyLength
// visible ASCII characters, none of them '"' or '\'.
func fuzzValidKey(k string) bool {
	if len(k) < 1 || len(k) > journal.MaxKeyLength {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"abc", `"abc"`, " abc ", "\tabc\t", `" abc"`, `"abc`, `abc"`, `""`, `"`, `"""`, `"a"b"`,
		"a b", `a\b`, "é", "\x7f", "\x00", "~!#$%&'()*+,-./:;<=>?@[]^_`{|}",
		"8e03978e-40d5-43e8-bc93-6894a57f9324", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		strings.Repeat("k", journal.MaxKeyLength), strings.Repeat("k", journal.MaxKeyLength+1),
		`"` + strings.Repeat("k", journal.MaxKeyLength) + `"`, "", "  ", "\u00a0abc\u00a0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := parseKey(v)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("parseKey(%q): %v does not wrap ErrInvalidKey", v, err)
			}
			fuzzWantPrefixOnce(t, err)
		} else {
			// Sound: what it accepts is a valid key, taken from the input.
			if !fuzzValidKey(k) {
				t.Fatalf("parseKey(%q) accepted %q: not 1-%d visible ASCII without '\"' or '\\'", v, k, journal.MaxKeyLength)
			}
			if !strings.Contains(v, k) {
				t.Fatalf("parseKey(%q) = %q, not part of its input", v, k)
			}
			// The quoted and bare forms agree, and formatKey's output reads
			// back as the same key in either form.
			for _, form := range []string{k, `"` + k + `"`, " \t" + k + " ", formatKey(k, false), formatKey(k, true)} {
				if k2, err := parseKey(form); err != nil || k2 != k {
					t.Fatalf("parseKey(%q) = %q, %v; want %q (from input %q)", form, k2, err, k, v)
				}
			}
			if formatKey(k, false) != k || formatKey(k, true) != `"`+k+`"` {
				t.Fatalf("formatKey(%q) = %q bare, %q quoted", k, formatKey(k, false), formatKey(k, true))
			}
		}
		// Complete: every valid key is accepted as is, bare and quoted.
		if fuzzValidKey(v) {
			for _, form := range []string{v, `"` + v + `"`} {
				if k2, err := parseKey(form); err != nil || k2 != v {
					t.Fatalf("parseKey(%q) = %q, %v; a valid key, want it back", form, k2, err)
				}
			}
		}
	})
}

// fuzzShort cuts a long id down for an error message.
func fuzzShort(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func FuzzCheckActionID(f *testing.F) {
	// The longest id WithAction may take: a 307/308 hop appends the
	// redirect infix and 16 hex digits, and the result must fit every
	// journal (journal.MaxActionID).
	limit := journal.MaxActionID - len(redirectActionInfix) - 16
	for _, s := range []string{
		"pay:order-A-1001", "", "key:abc", "fp:00", "KEY:abc", " key:abc", "key", "fp",
		"key:", "fp:", "\x00", "é", "\xff\xfe", "pay: redirect:0123456789abcdef",
		strings.Repeat("a", limit), strings.Repeat("a", limit+1), strings.Repeat("a", journal.MaxActionID),
	} {
		f.Add(s)
	}
	// Accepted ids, with and without a redirect suffix, must be ids every
	// journal stores (journal.CheckRecord); filejournal's FuzzActionID
	// checks that the file journal stores every such id byte for byte.
	f.Fuzz(func(t *testing.T, id string) {
		err := checkActionID(id)
		reserved := strings.HasPrefix(id, keyActionPrefix) || strings.HasPrefix(id, fingerprintActionPrefix)
		valid := id != "" && !reserved && len(id) <= limit
		if err != nil {
			if !errors.Is(err, ErrInvalidAction) {
				t.Fatalf("checkActionID(%q): %v does not wrap ErrInvalidAction", fuzzShort(id), err)
			}
			fuzzWantPrefixOnce(t, err)
			if valid {
				t.Fatalf("checkActionID(%q) refused a valid id (%d bytes, limit %d): %v", fuzzShort(id), len(id), limit, err)
			}
			return
		}
		if !valid {
			t.Fatalf("checkActionID(%q) accepted an id that is empty, reserved or over %d bytes (%d)", fuzzShort(id), limit, len(id))
		}
		for _, stored := range []string{id, id + redirectActionInfix + "0123456789abcdef"} {
			key, err := newUUIDKey()
			if err != nil {
				t.Fatal(err)
			}
			rec := journal.Record{ActionID: stored, Key: key, CreatedAt: time.Now(), State: journal.StatePending}
			if err := journal.CheckRecord(rec); err != nil {
				t.Fatalf("accepted id %q (%d bytes) is not one every journal stores: %v", fuzzShort(stored), len(stored), err)
			}
		}
	})
}
