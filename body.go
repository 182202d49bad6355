package idemretry

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// body gives every attempt a full, fresh copy of the request body.
type body struct {
	orig    io.ReadCloser                 // the caller's Body, sent on the first attempt; nil once handed on
	getBody func() (io.ReadCloser, error) // fresh copies; nil when there is no body
}

// newBody prepares req's body for several attempts. A body with GetBody is
// streamed, never buffered; one without is read into memory up to limit
// bytes. A larger one is refused (ErrBodyTooLarge): sending it once and then
// being unable to resend it would defeat the point of the Transport.
// The caller's Body is closed on error.
func newBody(req *http.Request, limit int64) (body, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return body{}, nil
	}
	if req.GetBody != nil {
		return body{orig: req.Body, getBody: req.GetBody}, nil
	}
	defer req.Body.Close()
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		return body{}, fmt.Errorf("idemretry: read request body: %w", err)
	}
	if int64(len(buf)) > limit {
		return body{}, fmt.Errorf("%w: more than %d bytes and no GetBody", ErrBodyTooLarge, limit)
	}
	return body{getBody: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf)), nil
	}}, nil
}

// reader returns a copy of the body to hash, or nil if there is none.
func (b *body) reader() (io.ReadCloser, error) {
	if b.getBody == nil {
		return nil, nil
	}
	return b.getBody()
}

// next returns the body for the next attempt: the caller's own on the first,
// a fresh copy after.
func (b *body) next() (io.ReadCloser, error) {
	if b.orig != nil {
		r := b.orig
		b.orig = nil
		return r, nil
	}
	if b.getBody == nil {
		return http.NoBody, nil
	}
	return b.getBody()
}

// close closes the caller's Body if no attempt took it: a RoundTripper must
// close the request body even when it sends nothing.
func (b *body) close() {
	if b.orig != nil {
		b.orig.Close()
		b.orig = nil
	}
}
