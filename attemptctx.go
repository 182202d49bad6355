package idemretry

// This file holds an attempt's context: the caller's, with the attempt's
// trace hooks and a cancel of its own, made in as few allocations as the
// context package allows.

import (
	"context"
	"net/http/httptrace"
	"time"
)

// context returns the attempt's context, made over the caller's ctx: ctx
// with a's hooks (see withTrace), which a.end cancels. a.end cuts a stalled
// read of a discarded or peeked-at body and, once the caller closes the
// body of the response it is given, lets go of what the base hung on the
// context.
//
// When ctx can never end (its Done is nil, as for context.Background and
// WithAction over it), the attemptTrace is already the context, and the
// base is an *http.Transport (direct), the attemptTrace is made cancellable
// itself: a Done channel of its own and an AfterFunc method, through which
// the context package links the context net/http derives from it for each
// request. That costs one allocation, the channel, where a
// context.WithCancel over it costs five with what net/http hangs on it.
// Only a context derived directly from the attemptTrace is linked that way:
// under a base that first wraps the context in a value of its own (as
// tracing transports do), the context package would watch the attemptTrace
// with a goroutine per attempt, so any other base gets a context.WithCancel,
// as does a ctx that can end (whose end the context package then carries to
// the attempt).
func (a *attemptTrace) context(ctx context.Context, direct bool) context.Context {
	c := a.withTrace(ctx)
	if direct && c == context.Context(a) && ctx.Done() == nil {
		a.done = make(chan struct{})
		return a
	}
	c, a.cancel = context.WithCancel(c)
	return c
}

// end cancels the attempt's context. It may be called more than once, and
// from a timer's goroutine while the attempt is read.
func (a *attemptTrace) end() {
	if a.cancel != nil {
		a.cancel()
		return
	}
	if a.done == nil {
		return
	}
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		return
	}
	a.ended = true
	close(a.done)
	after, more := a.after, a.more
	a.after, a.more = [1]func(){}, nil
	a.mu.Unlock()
	// As a cancelled context.WithCancel cancels its children: at once, in
	// this goroutine, outside the lock (a child's cancel asks for Err).
	for _, f := range after {
		if f != nil {
			f()
		}
	}
	for _, f := range more {
		f()
	}
}

// AfterFunc arranges for f to be called when the attempt's context ends,
// and returns a stop function. It is how the context package links a
// context derived from the attempt's to it (the afterFuncer case of
// context.WithCancel and context.AfterFunc), without a goroutine per
// attempt; the package's f only cancels the derived context. f runs in the
// goroutine that ends the attempt, or in its own goroutine if the attempt
// has already ended.
//
// The stop function leaves f registered and returns false: when the
// derived context ends first (net/http ends its own at the end of each
// request), f later cancels a context already cancelled, which does
// nothing; a stop that found f again would cost an allocation per attempt.
// The context package ignores what stop returns, and context.AfterFunc
// keeps its own record of whether its function ran.
//
// An attemptTrace that is not itself cancellable hands f to its parent.
func (a *attemptTrace) AfterFunc(f func()) (stop func() bool) {
	if a.done == nil {
		return context.AfterFunc(a.parent, f)
	}
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		go f()
		return keepAfterFunc
	}
	if a.after[0] == nil {
		a.after[0] = f
	} else {
		a.more = append(a.more, f)
	}
	a.mu.Unlock()
	return keepAfterFunc
}

// keepAfterFunc is the stop function of attemptTrace.AfterFunc.
func keepAfterFunc() bool { return false }

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
// caller's, with the trace, and, when it is cancellable itself (see
// context), its own Done and Err.

func (a *attemptTrace) Deadline() (time.Time, bool) { return a.parent.Deadline() }

func (a *attemptTrace) Done() <-chan struct{} {
	if a.done != nil {
		return a.done
	}
	return a.parent.Done()
}

func (a *attemptTrace) Err() error {
	if a.done != nil {
		a.mu.Lock()
		ended := a.ended
		a.mu.Unlock()
		if ended {
			return context.Canceled
		}
	}
	return a.parent.Err()
}

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
