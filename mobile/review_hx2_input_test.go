package idemretry_test

import (
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// hX2's review: a URL that no network can ever reach (a port out of
// range, a host with no name: ":80" dials this device) was taken as a
// network failure: retried until the timeout, KindNetwork ("send it again
// when the network is back"), and its action left pending in the journal,
// for Resume to send again at every start. It is a bad request: refused
// at once, KindInvalidRequest, nothing journaled.
func TestReviewHX2UnreachableURLRefused(t *testing.T) {
	c, _ := open(t, nil)
	for _, u := range []string{
		"http://127.0.0.1:99999/charges",
		"http://127.0.0.1:0/charges",
		"http://:80/charges",
		"https://:443/charges",
	} {
		t.Run(u, func(t *testing.T) {
			start := time.Now()
			_, err := c.Send(&idemretry.Request{Method: "POST", URL: u, Body: []byte("{}"), ActionID: "pay:url", TimeoutMillis: 3000})
			assert.Equal(t, idemretry.KindInvalidRequest, kindOf(t, err), "%v", err)
			assert.Less(t, time.Since(start), 2*time.Second, "retried")
		})
	}
	l, err := c.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len(), "a request that cannot be sent was journaled")
}

// hX2's review: error messages quote the app's strings cut to 64 bytes;
// cut inside a character, the message was not valid UTF-8, and neither is
// a response header's value in Latin-1 (HTTP allows it): gobind's
// Objective-C side makes no NSString of such bytes (the app reads "")
// where its Java side reads U+FFFD. Both read U+FFFD now.
func TestReviewHX2MessagesAreUTF8(t *testing.T) {
	srv := newPayServer(t)
	srv.setBefore(func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("X-Note", "caf\xe9")
		w.WriteHeader(http.StatusOK)
		return true
	})
	c, _ := open(t, nil)
	resp, err := c.Send(idemretry.NewRequest("GET", srv.URL+"/note"))
	require.NoError(t, err)
	assert.Equal(t, "caf\uFFFD", resp.Headers.Get("X-Note"))

	id := "pay:" + strings.Repeat("заказ", 20)
	_, err = c.Send(&idemretry.Request{Method: "POST", URL: "ftp://example.co/" + strings.Repeat("é", 40), ActionID: id})
	require.Error(t, err)
	assert.True(t, utf8.ValidString(idemretry.FailureOf(err).Message), "%q", idemretry.FailureOf(err).Message)
	err = c.Forget("")
	require.Error(t, err)
	r := &idemretry.Request{Method: "POST", URL: "http://127.0.0.1:1/", ActionID: strings.Repeat("ü", 1000)}
	_, err = c.Send(r)
	require.Error(t, err)
	assert.True(t, utf8.ValidString(idemretry.FailureOf(err).Message), "%q", idemretry.FailureOf(err).Message)
}
