package idemretry

// This file holds an attempt's context: the caller's, with the attempt's
// trace hooks and a cancel of its own.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"time"
)

// context returns the attempt's context, made over the caller's ctx: ctx
// with a's hooks (see withTrace), and a cancel of its own, which a.end
// calls. a.end cuts a stalled read of a discarded or peeked-at body and,
// once the caller closes the body of the response it is given, lets go of
// what the base hung on the context.
//
// It is a context.WithCancel, whose five allocations (with the child
// net/http registers in it) are most of what an attempt costs the context
// package. A context of the Transport's own, cancellable through an
// AfterFunc method, was tried and dropped: the context package links a
// context to it only when derived from it directly, so a context derived
// through a value of its own (a tracing RoundTripper registered with
// RegisterProtocol, or a caller deriving from a response's request) was
// watched by a goroutine of the context package that outlived RoundTrip.
func (a *attemptTrace) context(ctx context.Context) context.Context {
	c, cancel := context.WithCancel(a.withTrace(ctx))
	a.cancel = cancel
	return c
}

// end cancels the attempt's context. It may be called more than once, and
// from a timer's goroutine while the attempt is read.
func (a *attemptTrace) end() {
	if a.cancel != nil {
		a.cancel()
	}
}

// withTrace returns ctx with a's hooks, as httptrace.WithClientTrace does:
// a itself, a context that answers httptrace's lookup with a's hooks and
// everything else as ctx does, so that the trace needs no context of its
// own. A ctx that already carries a trace (whose hooks a's must compose
// with) is given a's by httptrace.WithClientTrace first, which composes
// them in a's own trace: a answers with it all the same. Either way a is
// in the attempt's context, where OutcomeOf finds it from the response's
// request.
func (a *attemptTrace) withTrace(ctx context.Context) context.Context {
	if clientTraceKey == nil || httptrace.ContextClientTrace(ctx) != nil {
		ctx = httptrace.WithClientTrace(ctx, &a.trace)
	}
	a.parent = ctx
	return a
}

// The context methods of an attemptTrace made the attempt's context: the
// caller's, with the trace.

func (a *attemptTrace) Deadline() (time.Time, bool) { return a.parent.Deadline() }
func (a *attemptTrace) Done() <-chan struct{}       { return a.parent.Done() }
func (a *attemptTrace) Err() error                  { return a.parent.Err() }
func (a *attemptTrace) Value(key any) any {
	switch key {
	case clientTraceKey:
		if clientTraceKey != nil {
			a.flags.Or(traced) // the base is told of the writes (see run.send)
			return &a.trace
		}
	case attemptKey{}:
		return a
	}
	return a.parent.Value(key)
}

// attemptKey is the key an attemptTrace answers with itself (see
// attemptOf).
type attemptKey struct{}

// attemptOf returns the attemptTrace of the attempt whose context ctx is,
// or is derived from, or nil.
func attemptOf(ctx context.Context) *attemptTrace {
	a, _ := ctx.Value(attemptKey{}).(*attemptTrace)
	return a
}

// clientTraceKey is the key httptrace.ContextClientTrace looks its hooks up
// by (unexported: learnt by watching it look), or nil if an attemptTrace
// cannot be found by it that way, and httptrace.WithClientTrace is used.
var clientTraceKey any

func init() {
	p := &keyProbe{Context: context.Background()}
	httptrace.ContextClientTrace(p)
	if p.key == nil {
		return
	}
	clientTraceKey = p.key
	a := &attemptTrace{parent: context.Background()}
	if httptrace.ContextClientTrace(a) != &a.trace {
		clientTraceKey = nil
	}
}

// keyProbe records the first key it is asked for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

// attemptBody is the body of a response returned to the caller: the
// attempt's own, read through the attemptTrace that holds it. Its Close,
// or a Read that reaches its end, ends the attempt's context, as net/http
// lets go of a request at its answer's end: a caller that reads an answer
// to its end and never closes it holds nothing of the attempt (its
// request, its body, a goroutine of the context package watching the
// caller's context) for as long as its context lives. At io.EOF the base's
// body is closed first, then the context ended (an HTTP/2 body's Close
// under an ended context returns before its stream is let go, and its
// connection is not idle yet when the caller closes idle connections);
// Reads after it give io.EOF again, and Close nil. A Read that fails ends
// the context and leaves the body to the caller's Close.
type attemptBody attemptTrace

func (b *attemptBody) Read(p []byte) (int, error) {
	if b.flags.Load()&bodyRead != 0 {
		return 0, io.EOF
	}
	n, err := b.resp.Read(p)
	switch {
	case err == io.EOF:
		if b.flags.Or(bodyRead)&bodyRead == 0 {
			b.resp.Close()
		}
		(*attemptTrace)(b).end()
	case err != nil:
		(*attemptTrace)(b).end()
	}
	return n, err
}

func (b *attemptBody) Close() error {
	var err error
	if b.flags.Load()&bodyRead == 0 { // else closed at its end
		err = b.resp.Close()
	}
	(*attemptTrace)(b).end()
	return err
}

// upgradedBody is attemptBody for a 101 Switching Protocols answer, whose
// body net/http makes the upgraded connection, an io.ReadWriteCloser: the
// caller writes to it too, after the other side has stopped sending, so
// only Close ends the attempt.
type upgradedBody attemptTrace

func (b *upgradedBody) Read(p []byte) (int, error)  { return b.resp.Read(p) }
func (b *upgradedBody) Write(p []byte) (int, error) { return b.resp.(io.Writer).Write(p) }
func (b *upgradedBody) Close() error                { return (*attemptBody)(b).Close() }

// cancelChannel returns req's Cancel channel, or nil (also for a nil req).
func cancelChannel(req *http.Request) <-chan struct{} {
	if req == nil {
		return nil
	}
	return req.Cancel //lint:ignore SA1019 honoured as net/http honours it
}

// errRequestCanceled is why the context of a request whose Cancel channel
// closed ended (context.Cause); it unwraps to context.Canceled.
var errRequestCanceled = fmt.Errorf("idemretry: the request's Cancel channel closed: %w", context.Canceled)

// roundTripCancel is RoundTrip for a request with a Cancel channel
// (deprecated, still honoured by net/http, and set by every http.Client
// with a Timeout on a RoundTripper of its own, such as a Transport). The
// channel becomes the end of the request's context, as net/http makes it,
// so that everything bounded by the caller's context ends with it: each
// attempt (whose failure is then the caller's own end, not a retried
// error), the waits between attempts, the wait in another caller's
// flight, the read of an answer. The request goes on with that context
// and no channel. The watch on the channel ends when RoundTrip returns
// nothing to read, or when the answer's body is read to its end or
// closed.
func (t *Transport) roundTripCancel(req *http.Request, ch <-chan struct{}) (*http.Response, error) {
	inner, cancel := context.WithCancelCause(req.Context())
	ctx := &cancelChanCtx{Context: inner, ch: ch, cancel: cancel}
	r := req.WithContext(ctx)
	r.Cancel = nil //lint:ignore SA1019 the channel is honoured through the context
	select {
	case <-ch:
		cancel(errRequestCanceled)
	default:
		go watchCancel(ctx, cancel, ch)
	}
	resp, err := t.RoundTrip(r)
	if err != nil || resp.Body == nil || resp.Body == http.NoBody {
		cancel(nil)
		return resp, err
	}
	if w, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &watchedUpgrade{w, cancel}
	} else {
		resp.Body = &watchedBody{resp.Body, cancel}
	}
	return resp, nil
}

// cancelChanCtx is the context of a request with a Cancel channel. Its
// Err looks at the channel itself, and ends the context when it finds it
// closed: every check of the caller's end (before each attempt, before
// each wait) sees a Cancel that closed before it, not only once
// watchCancel, on a goroutine of its own, has run. Done is the context's,
// closed by either.
type cancelChanCtx struct {
	context.Context
	ch     <-chan struct{}
	cancel context.CancelCauseFunc
}

func (c *cancelChanCtx) Err() error {
	select {
	case <-c.ch:
		c.cancel(errRequestCanceled)
	default:
	}
	return c.Context.Err()
}

// watchCancel ends ctx with errRequestCanceled when ch closes, unless ctx
// ends first.
func watchCancel(ctx context.Context, cancel context.CancelCauseFunc, ch <-chan struct{}) {
	select {
	case <-ch:
		cancel(errRequestCanceled)
	case <-ctx.Done():
	}
}

// watchedBody is the body of an answer to a request with a Cancel
// channel: once read to its end, or closed, it ends the watch (and the
// context it watched for, which nothing reads under any more).
type watchedBody struct {
	rc  io.ReadCloser
	end context.CancelCauseFunc
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.end(nil)
	}
	return n, err
}

func (b *watchedBody) Close() error {
	err := b.rc.Close()
	b.end(nil)
	return err
}

// watchedUpgrade is watchedBody for a 101's upgraded connection, which
// the caller writes to as well: only Close ends the watch.
type watchedUpgrade struct {
	rwc io.ReadWriteCloser
	end context.CancelCauseFunc
}

func (b *watchedUpgrade) Read(p []byte) (int, error)  { return b.rwc.Read(p) }
func (b *watchedUpgrade) Write(p []byte) (int, error) { return b.rwc.Write(p) }
func (b *watchedUpgrade) Close() error {
	err := b.rwc.Close()
	b.end(nil)
	return err
}
