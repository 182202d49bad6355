package idemretry

// hW3's review of folded hint lines: quoted elements, empty ones, a
// "false" folded on one header's line and a "true" on another's, and the
// one-pass scan (a header of at most scanHeaders names) against lookups.

import (
	"net/http"
	"strconv"
	"testing"
)

// Found in review hw3 (ca18fb8; was TestHW3FoldedHintsQuotedAndEmpty).
func TestHintsFoldedQuotedAndEmpty(t *testing.T) {
	for _, c := range []struct {
		h         http.Header
		retry, ok bool
	}{
		{http.Header{"Stripe-Should-Retry": {`"true", "false"`}}, false, true},
		{http.Header{"X-Should-Retry": {`, ,true,`}}, true, true},
		{http.Header{"X-Should-Retry": {`TRUE , "False"`}}, false, true},
		{http.Header{"X-Should-Retry": {`true`}, "Transient-Error": {`yes, false`}}, false, true},
		{http.Header{"X-Should-Retry": {`"true, false"`}}, false, false}, // one quoted string: neither
		{http.Header{"X-Should-Retry": {`,`, ``}}, false, false},
	} {
		for _, pad := range []int{0, scanHeaders} { // the scan, and lookups
			h := c.h.Clone()
			for i := range pad {
				h.Set("X-Pad-"+strconv.Itoa(i), "1")
			}
			if retry, ok := retryHint(h); retry != c.retry || ok != c.ok {
				t.Errorf("%v (+%d): retryHint = %v, %v; want %v, %v", c.h, pad, retry, ok, c.retry, c.ok)
			}
		}
	}
	for _, c := range []struct {
		v    string
		want bool
	}{{`false, "true"`, true}, {`false,,`, false}, {`"false, true"`, false}, {` , TRUE`, true}} {
		if got := IsReplay(&http.Response{Header: http.Header{"Idempotent-Replayed": {c.v}}}); got != c.want {
			t.Errorf("IsReplay(%q) = %v", c.v, got)
		}
	}
}
