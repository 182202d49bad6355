package idemretry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
)

// body gives every attempt a full, fresh copy of the request body.
type body struct {
	orig    io.ReadCloser                 // the caller's Body, sent on the first attempt; nil once handed on
	unsent  io.Closer                     // the caller's Body when a GetBody copy goes out in its place (see hashInto)
	getBody func() (io.ReadCloser, error) // fresh copies; nil when there is no body
	buf     []byte                        // the body, when newBody read it into memory
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
	// The read ends with the caller's context: a body that stalls (a pipe
	// whose writer never writes) is closed when it ends, which ends a read
	// that honours Close. net/http itself would wait for it.
	ctx := req.Context()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { req.Body.Close() })
		defer stop()
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, addSize(limit, 1)))
	if err != nil {
		if cerr := callerErr(ctx); cerr != nil {
			return body{}, fmt.Errorf("idemretry: read request body: %w (%w)", cerr, err)
		}
		return body{}, fmt.Errorf("idemretry: read request body: %w", err)
	}
	if int64(len(buf)) > limit {
		return body{}, fmt.Errorf("%w: more than %d bytes and no GetBody", ErrBodyTooLarge, limit)
	}
	return body{buf: buf, getBody: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf)), nil
	}}, nil
}

// writeTo writes the body to w without a copy where that gives the bytes
// GetBody gives: a body newBody read into memory (its GetBody is a reader
// over the same bytes). ok is false otherwise. The caller's own Body is
// never read in place, even an in-memory reader under io.NopCloser: its
// unread bytes are not always GetBody's (http.NewRequest's GetBody is a
// snapshot taken when the request was made; a Body read, written to or
// replaced since holds other bytes), and the fingerprint is of GetBody's,
// as it always was (it names unnamed actions and is stored in journals).
func (b *body) writeTo(w io.Writer) (ok bool, err error) {
	if b.getBody == nil || b.orig != nil || b.buf == nil {
		return false, nil
	}
	_, err = w.Write(b.buf)
	return true, err
}

// hashInto writes the body GetBody gives to a fingerprint's hash w: in
// place where it can be (writeTo), else from a copy from GetBody.
func (b *body) hashInto(w io.Writer) error {
	if ok, err := b.writeTo(w); ok || err != nil {
		return err
	}
	if b.getBody == nil {
		return nil
	}
	r, err := b.getBody()
	if err != nil {
		return err
	}
	if r == nil {
		return nil // GetBody gave no reader: no bytes
	}
	_, err = io.Copy(w, r)
	r.Close()
	// A GetBody copy may share its reader with the caller's Body
	// (openai-go's and anthropic-sdk-go's GetBody for a *bytes.Reader body
	// seeks that one reader back to 0 and returns it): read for the hash,
	// it may have left Body at its end. net/http calls GetBody only once
	// Body is sent; here every attempt sends a GetBody copy, the first
	// too, and the caller's Body is closed, unread, when RoundTrip ends.
	if b.orig != nil {
		b.unsent, b.orig = b.orig, nil
	}
	return err
}

// size returns the body's length where it is known before it is read
// (in memory, or GetBody's with a ContentLength), else -1.
func (b *body) size(req *http.Request) int64 {
	switch {
	case b.buf != nil:
		return int64(len(b.buf))
	case b.getBody != nil && req.ContentLength > 0:
		return req.ContentLength
	}
	return -1
}

// next returns the body for the next attempt: the caller's own on the first
// (unless the fingerprint read a GetBody copy: see hashInto), a fresh copy
// after.
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
	if b.unsent != nil {
		b.unsent.Close()
		b.unsent = nil
	}
}
