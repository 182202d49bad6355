package idemretry_test

// hW1's review: the keyed fingerprint (named actions, bodies of 512 bytes
// and more) at its size threshold and its 64 KiB chunk boundaries, with
// bodies read in odd pieces (GetBody's reader), buffered (no GetBody), and
// cut short by the base on the first attempt.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// boundaryRequest is a POST of body for action id: buffered (no GetBody), or
// with a GetBody whose reader yields the body in odd pieces and a known
// ContentLength.
func boundaryRequest(t *testing.T, url, id string, body []byte, getBody bool) *http.Request {
	ctx := idemretry.WithAction(context.Background(), id)
	if !getBody {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, struct{ io.Reader }{bytes.NewReader(body)})
		require.NoError(t, err)
		return req
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(iotest.HalfReader(bytes.NewReader(body))), nil
	}
	req.ContentLength = int64(len(body))
	return req
}

// Found in review hw1 (f949e43; was TestHW1KeyedFingerprintAtItsBoundaries).
func TestKeyedFingerprintAtItsBoundaries(t *testing.T) {
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	for _, size := range []int{511, 512, 513, 64<<10 - 1, 64 << 10, 64<<10 + 1, 128 << 10, 128<<10 + 3} {
		for _, firstGetBody := range []bool{false, true} {
			id := fmt.Sprintf("pay:%d-%v", size, firstGetBody)
			body := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
			resp, err := tr.RoundTrip(boundaryRequest(t, srv.URL, id, body, firstGetBody))
			require.NoError(t, err)
			readAll(t, resp)
			key := resp.Request.Header.Get("Idempotency-Key")
			// The same payload, read the other way: the same action.
			resp, err = tr.RoundTrip(boundaryRequest(t, srv.URL, id, body, !firstGetBody))
			require.NoError(t, err, "size %d: the same payload refused", size)
			readAll(t, resp)
			assert.Equal(t, key, resp.Request.Header.Get("Idempotency-Key"), "size %d", size)
			assert.True(t, idemretry.IsReplay(resp), "size %d", size)
			// One byte changed, at each chunk's edge, or one byte more or
			// less: another payload.
			for _, at := range []int{0, size / 2, size - 1, 64<<10 - 1, 64 << 10} {
				if at >= size {
					continue
				}
				other := bytes.Clone(body)
				other[at] ^= 1
				_, err = tr.RoundTrip(boundaryRequest(t, srv.URL, id, other, !firstGetBody))
				assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "size %d, byte %d changed", size, at)
			}
			for _, other := range [][]byte{body[:size-1], append(bytes.Clone(body), '0')} {
				_, err = tr.RoundTrip(boundaryRequest(t, srv.URL, id, other, firstGetBody))
				assert.ErrorIs(t, err, idemretry.ErrFingerprintMismatch, "size %d, %d bytes", size, len(other))
			}
		}
	}
	assert.Equal(t, 16, srv.chargeCount())
}

// halfReadingBase reads part of the first attempt's body and fails as a
// dropped connection would; later attempts go through.
type halfReadingBase struct {
	base  http.RoundTripper
	calls atomic.Int32
}

func (h *halfReadingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if h.calls.Add(1) == 1 {
		_, _ = io.CopyN(io.Discard, req.Body, 300)
		req.Body.Close()
		return nil, errors.New("test: connection reset by peer")
	}
	return h.base.RoundTrip(req)
}

// A body the base read part of before failing is sent whole on the retry,
// under the same key, and the action is then one payload with a later
// resend of it.
//
// Found in review hw1 (f949e43; was TestHW1BodyCutByTheBaseIsResentWhole).
func TestBodyCutByTheBaseIsResentWhole(t *testing.T) {
	for _, getBody := range []bool{false, true} {
		for _, size := range []int{513, 64<<10 + 1} {
			var got []int
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got = append(got, len(b))
				w.WriteHeader(http.StatusCreated)
			})
			base := &halfReadingBase{base: &http.Transport{}}
			tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()), idemretry.WithBackOff(constant(0)))
			require.NoError(t, err)
			body := bytes.Repeat([]byte{'x'}, size)
			resp, err := tr.RoundTrip(boundaryRequest(t, srv.URL, "pay:cut", body, getBody))
			require.NoError(t, err)
			readAll(t, resp)
			resp, err = tr.RoundTrip(boundaryRequest(t, srv.URL, "pay:cut", body, !getBody))
			require.NoError(t, err, "the same payload refused")
			readAll(t, resp)
			assert.Equal(t, []int{size, size}, got, "GetBody %v", getBody)
			require.NoError(t, tr.Close())
			base.base.(*http.Transport).CloseIdleConnections()
		}
	}
}
