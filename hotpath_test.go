package idemretry

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/google/uuid"
)

// newUUIDKey makes its keys itself, in one allocation: each must be a
// canonical random (version 4, RFC 9562 variant) UUID, as uuid.NewRandom
// makes them, and no two alike.
func TestNewUUIDKeyIsCanonicalV4(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		k, err := newUUIDKey()
		if err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(k)
		if err != nil {
			t.Fatalf("%q: %v", k, err)
		}
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != k {
			t.Fatalf("%q: version %d, variant %v, canonical %q", k, u.Version(), u.Variant(), u.String())
		}
		if seen[k] {
			t.Fatalf("%q made twice", k)
		}
		seen[k] = true
	}
}

// IsReplay and the retry hints look the header names up as they are
// written, without canonicalising them: each must be in canonical form, as
// net/http stores the headers it reads, or the lookup would miss.
func TestHintHeaderNamesAreCanonical(t *testing.T) {
	for _, names := range [][]string{replayHeaders[:], retryHeaders[:]} {
		for _, name := range names {
			if c := http.CanonicalHeaderKey(name); c != name {
				t.Errorf("%q is not canonical (%q)", name, c)
			}
		}
	}
}

// The default policy reads no body but on the statuses where a server
// refuses a key as reused; any other policy may read any body.
func TestMayReadBody(t *testing.T) {
	custom := func(_ context.Context, resp *http.Response, err error) bool { return false }
	for _, tc := range []struct {
		policy RetryPolicy
		status int
		want   bool
	}{
		{DefaultRetryPolicy, 201, false},
		{DefaultRetryPolicy, 503, false},
		{DefaultRetryPolicy, 400, true},
		{DefaultRetryPolicy, 409, true},
		{DefaultRetryPolicy, 422, true},
		{custom, 201, true},
		{custom, 503, true},
	} {
		if got := mayReadBody(tc.policy, &http.Response{StatusCode: tc.status}); got != tc.want {
			t.Errorf("status %d: mayReadBody = %v, want %v", tc.status, got, tc.want)
		}
	}
}

// appendURL writes the bytes of URL.String, which the fingerprint hashes:
// one byte of difference would give a stored action another fingerprint.
func TestAppendURLIsURLString(t *testing.T) {
	for _, s := range appendURLSeeds {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if got, want := string(appendURL([]byte("x"), u)), "x"+u.String(); got != want {
			t.Errorf("%q: appendURL %q, String %q", s, got, want)
		}
	}
	// Hand-made URLs, which Parse would not give.
	for _, u := range []*url.URL{
		{Scheme: "http", Host: "h", Path: "a/b"},
		{Scheme: "http", Host: "h", Path: "/a b", ForceQuery: true},
		{Scheme: "http", Host: "h", Path: "/p", RawQuery: "a=1&b=%20", Fragment: "f"},
		{Scheme: "https", Host: "h", Path: "/p", OmitHost: true},
		{Scheme: "http", Host: "h", Path: "*"},
		{Scheme: "http", Host: "h", Path: "/ü"},
		{Scheme: "http", Host: "h", Path: "/a%2Fb", RawPath: "/a%2Fb"},
		{Scheme: "http", Host: "[::1]:80", Path: "/"},
		{Scheme: "http", Host: "h", Path: "/", User: url.UserPassword("u", "p")},
	} {
		if got, want := string(appendURL(nil, u)), u.String(); got != want {
			t.Errorf("%#v: appendURL %q, String %q", u, got, want)
		}
	}
}

var appendURLSeeds = []string{
	"http://stub.invalid/charges", "https://api.example.com/v1/payments?expand=charge",
	"http://127.0.0.1:8080/", "http://[::1]:80/x", "http://h", "http://h?", "http://h/?a=b#frag",
	"http://h/a%20b", "http://h/a%2Fb", "http://user:pw@h/p", "mailto:x@y", "/relative/path",
	"http://h/~user/a-b_c.d", "http://h/a:b@c;d=e", "HTTP://H/P", "http://h/*", "http://h/%7E",
	"http://xn--nxasmq6b.example/p", "http://h/p?q=%ZZ", "http://h:/p", "//h/p",
}

func FuzzAppendURL(f *testing.F) {
	for _, s := range appendURLSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		if got, want := string(appendURL(nil, u)), u.String(); got != want {
			t.Fatalf("%q: appendURL %q, String %q", s, got, want)
		}
	})
}
