package idemretry

import (
	"context"
	"net/http"
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
