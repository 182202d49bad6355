package idemretry

// This file holds an attempt's context: the caller's, with the attempt's
// trace hooks and a cancel of its own.

import (
	"context"
	"io"
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
// with) gets httptrace.WithClientTrace's.
func (a *attemptTrace) withTrace(ctx context.Context) context.Context {
	if clientTraceKey == nil || httptrace.ContextClientTrace(ctx) != nil {
		return httptrace.WithClientTrace(ctx, &a.trace)
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
	if key == clientTraceKey {
		return &a.trace
	}
	return a.parent.Value(key)
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
// attempt's own, read through the attemptTrace that holds it, whose Close
// ends the attempt's context.
type attemptBody attemptTrace

func (b *attemptBody) Read(p []byte) (int, error) { return b.resp.Read(p) }

func (b *attemptBody) Close() error {
	err := b.resp.Close()
	(*attemptTrace)(b).end()
	return err
}

// upgradedBody is attemptBody for a 101 Switching Protocols answer, whose
// body net/http makes the upgraded connection, an io.ReadWriteCloser: the
// caller writes to it too.
type upgradedBody attemptTrace

func (b *upgradedBody) Read(p []byte) (int, error)  { return b.resp.Read(p) }
func (b *upgradedBody) Write(p []byte) (int, error) { return b.resp.(io.Writer).Write(p) }
func (b *upgradedBody) Close() error                { return (*attemptBody)(b).Close() }
