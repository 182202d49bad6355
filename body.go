package idemretry

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
)

// body gives every attempt a full, fresh copy of the request body.
type body struct {
	orig    io.ReadCloser                 // the caller's Body, sent on the first attempt; nil once handed on
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
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		return body{}, fmt.Errorf("idemretry: read request body: %w", err)
	}
	if int64(len(buf)) > limit {
		return body{}, fmt.Errorf("%w: more than %d bytes and no GetBody", ErrBodyTooLarge, limit)
	}
	return body{buf: buf, getBody: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf)), nil
	}}, nil
}

// writeTo writes the body the first attempt sends to w without reading it,
// where that can be done: a body read into memory, or the caller's own
// Body when it is an in-memory reader (*bytes.Reader, *strings.Reader,
// *bytes.Buffer) wrapped by io.NopCloser, as http.NewRequest makes it (its
// unread bytes, through ReadAt or Bytes). ok is false otherwise. It spares
// the copy that fingerprinting would read from GetBody.
func (b *body) writeTo(w io.Writer, scratch []byte) (ok bool, err error) {
	if b.getBody == nil {
		return false, nil
	}
	if b.orig == nil {
		if b.buf == nil {
			return false, nil
		}
		_, err = w.Write(b.buf)
		return true, err
	}
	t := reflect.TypeOf(b.orig)
	if t != nopCloserType && t != nopCloserWriterToType {
		return false, nil
	}
	switch r := reflect.ValueOf(b.orig).Field(0).Interface().(type) {
	case *bytes.Buffer:
		_, err = w.Write(r.Bytes())
		return true, err
	case *bytes.Reader:
		return true, writeAt(w, r, r.Size()-int64(r.Len()), r.Size(), scratch)
	case *strings.Reader:
		return true, writeAt(w, r, r.Size()-int64(r.Len()), r.Size(), scratch)
	}
	return false, nil
}

// The types of io.NopCloser's results (as net/http finds them).
var (
	nopCloserType         = reflect.TypeOf(io.NopCloser(struct{ io.Reader }{}))
	nopCloserWriterToType = reflect.TypeOf(io.NopCloser(struct {
		io.Reader
		io.WriterTo
	}{}))
)

// writeAt writes r's bytes from off to end to w, through scratch.
func writeAt(w io.Writer, r io.ReaderAt, off, end int64, scratch []byte) error {
	for off < end {
		n, err := r.ReadAt(scratch[:min(int64(len(scratch)), end-off)], off)
		if n > 0 {
			if _, werr := w.Write(scratch[:n]); werr != nil {
				return werr
			}
			off += int64(n)
		}
		if err != nil && (err != io.EOF || off < end) {
			return err
		}
	}
	return nil
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
