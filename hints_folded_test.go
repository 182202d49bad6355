package idemretry_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

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
