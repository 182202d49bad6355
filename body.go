package idemretry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
)

// body gives every attempt a full, fresh copy of the request body.
type body struct {
	orig    io.ReadCloser                 // the caller's Body, sent on the first attempt; nil once handed on
	unsent  io.Closer                     // the caller's Body when a GetBody copy goes out in its place (see hashInto)
	getBody func() (io.ReadCloser, error) // fresh copies; nil when there is no body
	buf     []byte                        // the body, when newBody read it into memory
	ctx     context.Context               // the caller's, which ends a GetBody copy's read for the fingerprint; nil without GetBody
	// sum is a hash of the GetBody copy the fingerprint read, when it
	// read one (hashInto): every attempt's copy is checked against it
	// (next). checked says sum is set. The hash guards against a
	// copy that changed by accident (a buffer written to, a file
	// rewritten), not against the caller's own GetBody: maphash, seeded
	// per process, 64 bits.
	sum     uint64
	checked bool
	last    *checkedBody                  // the last attempt's copy, if checked and streamed
	resend  func() (io.ReadCloser, error) // checkedCopies of getBody and sum, once an attempt needs it
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
		return body{orig: req.Body, getBody: req.GetBody, ctx: req.Context()}, nil
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
	// The read ends with the caller's context, as newBody's does: a copy
	// that stalls is closed when it ends.
	stop := func() bool { return true }
	if b.ctx != nil && b.ctx.Done() != nil {
		stop = context.AfterFunc(b.ctx, func() { r.Close() })
	}
	tee := teePool.Get().(*teeHash)
	tee.w = w
	tee.h.SetSeed(bodySeed) // and reset
	_, err = io.Copy(tee, r)
	sum := tee.h.Sum64()
	tee.w = nil
	teePool.Put(tee)
	if stop() { // else the AfterFunc closed it
		r.Close()
	} else if err != nil {
		err = fmt.Errorf("%w (%w)", b.ctx.Err(), err)
	}
	if err == nil {
		b.sum, b.checked = sum, true
	}
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

// next returns the body for the next attempt and the GetBody net/http's
// own resends of it take: the caller's own on the first (unless the
// fingerprint read a GetBody copy: see hashInto), a fresh copy after. A
// copy is checked against the fingerprint's bytes once it read one: an
// in-memory copy (inMemory) in place before it is sent, and sent as it is,
// so that net/http writes it with the headers in one write; any other as
// it streams (checkedBody). An in-memory copy with other bytes is closed
// and refused (errBodyChanged).
func (b *body) next() (io.ReadCloser, func() (io.ReadCloser, error), error) {
	if b.orig != nil {
		r := b.orig
		b.orig = nil
		return r, b.getBody, nil
	}
	if b.getBody == nil {
		return http.NoBody, nil, nil
	}
	r, err := b.getBody()
	if err != nil || r == nil || !b.checked {
		return r, b.getBody, err
	}
	b.last = nil
	if sum, ok := inMemorySum(r); ok {
		if sum != b.sum {
			r.Close()
			return nil, nil, errBodyChanged
		}
		if b.resend == nil {
			b.resend = checkedCopies(b.getBody, b.sum)
		}
		return r, b.resend, nil
	}
	c := newChecked(r, b.getBody, b.sum, nil) // an attempt's own: the base's writer of the last may still read its own
	b.last = c
	return c, c.copies, nil
}

// checkedCopies returns a GetBody for net/http's own resends of an attempt
// whose copy was in memory: each copy of get is checked against sum as
// next checks an attempt's. A streamed copy with other bytes tells it by
// its read error alone (errBodyChanged).
func checkedCopies(get func() (io.ReadCloser, error), sum uint64) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		r, err := get()
		if err != nil || r == nil {
			return r, err
		}
		if s, ok := inMemorySum(r); ok {
			if s != sum {
				r.Close()
				return nil, errBodyChanged
			}
			return r, nil
		}
		return newChecked(r, get, sum, nil), nil
	}
}

// inMemory unwraps r to the reader net/http knows to be in memory (see
// its isKnownInMemoryReader): a *bytes.Reader, *bytes.Buffer or
// *strings.Reader, under io.NopCloser or not. ok is false for any other.
func inMemory(r io.Reader) (_ io.Reader, ok bool) {
	switch r.(type) {
	case *bytes.Reader, *bytes.Buffer, *strings.Reader:
		return r, true
	}
	switch reflect.TypeOf(r) {
	case nopCloserType, nopCloserWriterToType:
		inner, _ := reflect.ValueOf(r).Field(0).Interface().(io.Reader)
		switch inner.(type) {
		case *bytes.Reader, *bytes.Buffer, *strings.Reader:
			return inner, true
		}
	}
	return nil, false
}

var (
	nopCloserType         = reflect.TypeOf(io.NopCloser(nil))
	nopCloserWriterToType = reflect.TypeOf(io.NopCloser(strings.NewReader("")))
)

// inMemorySum returns the hash (as body.sum) of the bytes an in-memory
// reader (inMemory) has left to give, read in place: the reader is left
// as it was. ok is false for any other reader.
func inMemorySum(r io.Reader) (sum uint64, ok bool) {
	m, ok := inMemory(r)
	if !ok {
		return 0, false
	}
	if buf, isBuf := m.(*bytes.Buffer); isBuf {
		return maphash.Bytes(bodySeed, buf.Bytes()), true
	}
	h := hashPool.Get().(*maphash.Hash)
	h.SetSeed(bodySeed) // and reset
	// A *bytes.Reader or a *strings.Reader: their Seek fails only on a bad
	// whence or a negative offset, and a maphash.Hash never fails a write.
	if v, ok := m.(interface {
		io.Seeker
		io.WriterTo
	}); ok {
		at, _ := v.Seek(0, io.SeekCurrent)
		_, _ = v.WriteTo(h)
		_, _ = v.Seek(at, io.SeekStart)
	}
	sum = h.Sum64()
	hashPool.Put(h)
	return sum, true
}

// hashPool holds inMemorySum's hashes: a local one, written through an
// interface, would be an allocation per check.
var hashPool = sync.Pool{New: func() any { return new(maphash.Hash) }}

// newChecked returns r checked against sum, telling changed (its own flag
// if nil) if it gives other bytes; get gives the attempt's further copies.
func newChecked(r io.ReadCloser, get func() (io.ReadCloser, error), sum uint64, changed *atomic.Bool) *checkedBody {
	c := &checkedBody{r: r, get: get, sum: sum}
	if changed == nil {
		changed = &c.own
	}
	c.changed = changed
	c.h.SetSeed(bodySeed)
	return c
}

// copies is an attempt's GetBody, for the base's own resends (net/http
// resends a request with an Idempotency-Key by itself when a reused
// connection dies): each copy is checked as the attempt's is.
func (c *checkedBody) copies() (io.ReadCloser, error) {
	r, err := c.get()
	if err != nil || r == nil {
		return r, err
	}
	return newChecked(r, c.get, c.sum, c.changed), nil
}

// changed reports whether the last attempt's streamed copy gave other
// bytes than the fingerprint's (checkedBody). An in-memory copy's are
// told by errBodyChanged (next, checkedCopies).
func (b *body) changed() bool { return b.last != nil && b.last.changed.Load() }

// bodySeed seeds the hashes that check a body's copies (body.sum).
var bodySeed = maphash.MakeSeed()

// teePool holds hashInto's writers: one per body would move the body,
// and the request's state with it, to the heap.
var teePool = sync.Pool{New: func() any { return new(teeHash) }}

// teeHash writes to w and to h.
type teeHash struct {
	w io.Writer
	h maphash.Hash
}

func (t *teeHash) Write(p []byte) (int, error) {
	t.h.Write(p)
	return t.w.Write(p)
}

// errBodyChanged is an attempt's error when its GetBody copy gave other
// bytes than the one the fingerprint read: a streamed copy's read error
// (checkedBody), an in-memory copy's refusal (next, checkedCopies).
var errBodyChanged = errors.New("idemretry: GetBody gave other bytes than the fingerprint's")

// checkedBody is an attempt's GetBody copy that is not in memory (an
// in-memory one is checked in place: next), checked against the bytes the
// fingerprint read (body.sum). It holds back the last byte read until the
// copy's end: there, a copy with other bytes fails the read
// (errBodyChanged) and its last byte is never sent, so the server never
// receives a whole body other than the fingerprinted one under the key.
type checkedBody struct {
	r   io.ReadCloser
	get func() (io.ReadCloser, error) // the caller's GetBody
	sum uint64                        // body.sum
	h   maphash.Hash
	// changed: a copy of the attempt gave other bytes. Set by the base's
	// writer, which may outlive its RoundTrip; shared by the attempt's
	// copies (copies), own's unless given.
	changed *atomic.Bool
	own     atomic.Bool
	held    [1]byte
	has     bool
	err     error
	out     heldWriter // WriteTo's
}

func (c *checkedBody) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) == 1 {
		var two [2]byte
		n, err := c.Read(two[:]) // at most one byte: the other is held
		copy(p, two[:n])
		return n, err
	}
	for {
		off := 0
		if c.has {
			p[0], off = c.held[0], 1
		}
		n, err := c.r.Read(p[off:])
		c.h.Write(p[off : off+n])
		n += off
		switch {
		case err == io.EOF:
			if c.h.Sum64() != c.sum {
				c.changed.Store(true)
				c.err = errBodyChanged
				return 0, c.err
			}
			c.has, c.err = false, io.EOF
			return n, io.EOF
		case err != nil:
			c.err = err
			return 0, err
		case n > 0:
			c.held[0], c.has = p[n-1], true
			if n > 1 {
				return n - 1, nil
			}
		}
	}
}

// WriteTo writes the copy to w through the copy's own WriteTo, if it has
// one (an in-memory reader: no buffer), holding its last byte back as
// Read does.
func (c *checkedBody) WriteTo(w io.Writer) (int64, error) {
	wt, ok := c.r.(io.WriterTo)
	if !ok || c.has || c.err != nil {
		return io.Copy(w, readOnly{c})
	}
	c.out = heldWriter{c: c, w: w}
	_, err := wt.WriteTo(&c.out)
	n := c.out.n
	switch {
	case err == nil && c.out.err != nil:
		err = c.out.err
	case err == nil && c.h.Sum64() != c.sum:
		c.changed.Store(true)
		err = errBodyChanged
	case err == nil && c.has:
		var k int
		k, err = w.Write(c.held[:])
		n += int64(k)
		c.has = false
	}
	c.err = err
	if err == nil {
		c.err = io.EOF
	}
	return n, err
}

// readOnly hides checkedBody's WriteTo from io.Copy.
type readOnly struct{ c *checkedBody }

func (r readOnly) Read(p []byte) (int, error) { return r.c.Read(p) }

// heldWriter writes all but the last byte written to it on to w, and
// hashes every byte, for checkedBody.WriteTo.
type heldWriter struct {
	c   *checkedBody
	w   io.Writer
	n   int64
	err error
}

func (h *heldWriter) Write(p []byte) (int, error) {
	if h.err != nil {
		return 0, h.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	c := h.c
	c.h.Write(p)
	if c.has {
		k, err := h.w.Write(c.held[:])
		h.n += int64(k)
		if err != nil {
			h.err = err
			return 0, err
		}
	}
	k, err := h.w.Write(p[:len(p)-1])
	h.n += int64(k)
	if err != nil {
		h.err = err
		return 0, err
	}
	c.held[0], c.has = p[len(p)-1], true
	return len(p), nil
}

func (c *checkedBody) Close() error { return c.r.Close() }

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
