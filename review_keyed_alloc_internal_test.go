package idemretry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/internal/race"
	"github.com/idemretry/idemretry/journal"
)

// answerAtOnce is a base RoundTripper that reads the body and answers 201,
// with no network: what the Transport itself allocates is all there is.
type answerAtOnce struct{}

func (answerAtOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody, Request: req, Header: http.Header{}}, nil
}

// smallNamedPostAllocs is what a RoundTrip below made before the keyed
// fingerprint (commit 4346228), measured by this test on that commit (11),
// plus the one newUUIDKey has added since it reads the key's bytes through
// uuid.NewRandomFromReader (issue 27).
const smallNamedPostAllocs = 12

// The 1 KiB named POST of issue 12's goal 1 (B/op and allocs/op below both
// peers): the keyed fingerprint, which a 1 KiB body takes, must not cost
// it an allocation.
//
// Found in the review of the keyed fingerprint (e064b6d; was TestReviewKeyedFormCostsTheSmallNamedPostNoAllocation).
func TestKeyedFormCostsTheSmallNamedPostNoAllocation(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	tr, err := NewTransport(answerAtOnce{}, WithJournal(journal.NewMemory()))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	p := []byte(strings.Repeat("x", 1024))
	reqs := make([]*http.Request, 0, 2000)
	for i := range cap(reqs) {
		req, err := http.NewRequestWithContext(WithAction(context.Background(), fmt.Sprintf("pay:%06d", i)),
			http.MethodPost, "http://stub.invalid/charges", bytes.NewReader(p))
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, req)
	}
	i := 0
	send := func() {
		resp, err := tr.RoundTrip(reqs[i])
		i++
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send() // warm up
	n := testing.AllocsPerRun(1000, send)
	t.Logf("%v allocations per RoundTrip", n)
	if n > smallNamedPostAllocs {
		t.Fatalf("a 1 KiB named POST made %v allocations per RoundTrip, %d before the keyed form", n, smallNamedPostAllocs)
	}
}
