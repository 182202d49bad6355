package idemretry_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A drop-in transport leaves an answer without a body as net/http gives
// it: resp.Body == http.NoBody (a 204, a HEAD, a Content-Length: 0), which
// callers test to skip a read, keyed or not.
func TestAnswerWithoutABodyStaysNoBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Empty") == "length" {
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tr, _, _ := newTestTransport(t)
	c := &http.Client{Transport: tr}
	for _, tc := range []struct {
		name, method, empty string
		named               bool
	}{
		{"POST 204, named", http.MethodPost, "", true},
		{"POST 204, unnamed", http.MethodPost, "", false},
		{"POST 201 Content-Length 0, named", http.MethodPost, "length", true},
		{"HEAD", http.MethodHead, "", false},
		{"GET 204", http.MethodGet, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.named {
				ctx = idemretry.WithAction(ctx, "nobody:"+tc.name)
			}
			var body io.Reader
			if tc.method == http.MethodPost {
				body = bytes.NewReader([]byte(`{"amount":100}`))
			}
			req, err := http.NewRequestWithContext(ctx, tc.method, srv.URL, body)
			require.NoError(t, err)
			req.Header.Set("X-Empty", tc.empty)
			base, err := http.DefaultTransport.RoundTrip(req.Clone(ctx))
			require.NoError(t, err)
			require.NoError(t, base.Body.Close())
			require.Equal(t, http.NoBody, base.Body, "net/http itself gives this answer a body: the case tests nothing")

			if tc.method == http.MethodPost {
				req, err = http.NewRequestWithContext(ctx, tc.method, srv.URL, bytes.NewReader([]byte(`{"amount":100}`)))
				require.NoError(t, err)
				req.Header.Set("X-Empty", tc.empty)
			}
			resp, err := c.Do(req)
			require.NoError(t, err)
			assert.Equal(t, http.NoBody, resp.Body)
			n, err := io.Copy(io.Discard, resp.Body)
			assert.NoError(t, err)
			assert.Zero(t, n)
			assert.NoError(t, resp.Body.Close())
		})
	}
}

// A caller that joined the flight of an answer without a body gets
// http.NoBody too.
func TestJoinerOfAnAnswerWithoutABodyGetsNoBody(t *testing.T) {
	arrived, answer := make(chan struct{}, 2), make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		requests.Add(1)
		arrived <- struct{}{}
		<-answer
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	tr, _, _ := newTestTransport(t)
	c := &http.Client{Transport: tr}
	post := func() (*http.Response, error) {
		return c.Post(srv.URL, "application/json", bytes.NewReader([]byte(`{"amount":100}`)))
	}
	type result struct {
		resp *http.Response
		err  error
	}
	first := make(chan result, 1)
	go func() {
		resp, err := post()
		first <- result{resp, err}
	}()
	<-arrived
	second := make(chan result, 1)
	go func() {
		resp, err := post() // the same method, URL and body: it joins the flight
		second <- result{resp, err}
	}()
	time.Sleep(100 * time.Millisecond) // the second tap has joined
	close(answer)
	for _, ch := range []chan result{first, second} {
		r := <-ch
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusNoContent, r.resp.StatusCode)
		assert.Equal(t, http.NoBody, r.resp.Body)
		assert.NoError(t, r.resp.Body.Close())
	}
	assert.Equal(t, int32(1), requests.Load(), "the second tap did not join the first's flight: the test tested nothing")
}
