package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemretry/idemretry"
)

// An http.RoundTripper must not modify the request it is given (net/http's
// contract). idemretry keeps it; the peers do not, which matters to a caller
// who logs, re-signs or resends its request. The test asserts it for
// idemretry and, for the peers, only logs what it sees: their behaviour is
// not this project's to pin down.
func TestCallerRequestUntouched(t *testing.T) {
	srv := NewCheckingServer(SmallBody, true) // a retry makes the peers swap the body
	defer srv.Close()
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			c := testClient(t, name)
			ctx := context.Background()
			if c.Keyed {
				ctx = idemretry.WithAction(ctx, t.Name())
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL,
				bytes.NewReader(payload(SmallBody)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(ActionHeader, t.Name())
			before := snapshot(req)
			resp, err := c.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			discard(resp)
			// plain net/http does not retry: its 503 is expected here.
			if resp.StatusCode != http.StatusCreated && name != NetHTTP {
				t.Fatalf("status %d, want 201", resp.StatusCode)
			}
			changed := before.diff(snapshot(req))
			switch {
			case len(changed) == 0:
				t.Logf("%s left the caller's request as it was", name)
			case c.Keyed || name == NetHTTP:
				t.Errorf("%s modified the caller's request: %s", name, strings.Join(changed, "; "))
			default:
				t.Logf("observed: %s modified the caller's request: %s", name, strings.Join(changed, "; "))
			}
		})
	}
}

// reqState is what a caller could notice of its request after Do.
type reqState struct {
	body          any
	hasGetBody    bool
	contentLength int64
	header        http.Header
	ctx           context.Context
	url, method   string
}

func snapshot(r *http.Request) reqState {
	return reqState{r.Body, r.GetBody != nil, r.ContentLength, r.Header.Clone(), r.Context(),
		r.URL.String(), r.Method}
}

func (a reqState) diff(b reqState) []string {
	var d []string
	if a.body != b.body {
		d = append(d, fmt.Sprintf("Body %T replaced by %T", a.body, b.body))
	}
	if a.hasGetBody != b.hasGetBody {
		d = append(d, "GetBody changed")
	}
	if a.contentLength != b.contentLength {
		d = append(d, fmt.Sprintf("ContentLength %d -> %d", a.contentLength, b.contentLength))
	}
	if !reflect.DeepEqual(a.header, b.header) {
		d = append(d, fmt.Sprintf("Header %v -> %v", a.header, b.header))
	}
	if a.ctx != b.ctx {
		d = append(d, "context replaced")
	}
	if a.url != b.url || a.method != b.method {
		d = append(d, "method or URL changed")
	}
	return d
}
