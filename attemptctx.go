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
// the attempt). An *http.Transport that hands a scheme to a RoundTripper
// registered with RegisterProtocol may wrap it too: the first response that
// comes back without the attempt's context linked shows it, and from then
// on the Transport gives every attempt a context.WithCancel (that one
// attempt is watched by a goroutine until its body is closed).
func (a *attemptTrace) context(ctx context.Context, direct bool) context.Context {
	c := a.withTrace(ctx)
	if direct && cancelCtxKey != nil && c == context.Context(a) && ctx.Done() == nil {
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
	first := a.first
	var more []func()
	for r := range a.more {
		more = append(more, r.f)
	}
	a.first, a.more = nil, nil
	a.mu.Unlock()
	// As a cancelled context.WithCancel cancels its children: at once, in
	// this goroutine, outside the lock (a child's cancel asks for Err).
	if first != nil {
		first()
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
// The first f registered (the context net/http derives for the request)
// is kept until the attempt ends, whatever its stop function is told: when
// that context ends first (net/http ends its own at the end of each
// request), f later cancels a context already cancelled, which does
// nothing, and a stop that could find f again would cost an allocation per
// attempt. Its stop returns false; the context package ignores what stop
// returns. Every later f (a context the caller derives from the response's
// request, say) gets a stop that lets go of it, as a context.WithCancel
// lets go of a child that ended, so that deriving and cancelling contexts
// while a body is open keeps nothing.
//
// An attemptTrace that is not itself cancellable hands f to its parent.
func (a *attemptTrace) AfterFunc(f func()) (stop func() bool) {
	if a.done == nil {
		return context.AfterFunc(a.parent, f)
	}
	a.linked.Store(true)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.ended:
		go f()
		return keepFirstAfterFunc
	case a.first == nil:
		a.first = f
		return keepFirstAfterFunc
	}
	r := &afterFunc{f}
	if a.more == nil {
		a.more = make(map[*afterFunc]struct{})
	}
	a.more[r] = struct{}{}
	return func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, ok := a.more[r]
		delete(a.more, r)
		// The derived context holds this stop, which holds r: without f,
		// r no longer holds the context in turn, and no cycle through it
		// stays (a cycle is not collected if one of its objects has a
		// finalizer).
		r.f = nil
		return ok
	}
}

// afterFunc is one function registered with attemptTrace.AfterFunc after
// the first; its pointer identifies it.
type afterFunc struct{ f func() }

// keepFirstAfterFunc is the stop function of the first function registered
// with attemptTrace.AfterFunc.
func keepFirstAfterFunc() bool { return false }

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
	switch {
	case key == clientTraceKey:
		return &a.trace
	case a.done != nil && key == cancelCtxKey:
		// The context package's lookup of the cancelCtx a context derives
		// from (for context.Cause, and to link children): a cancellable
		// attemptTrace is one of its own, whatever a parent that never ends
		// passes on (a hand-written "detach" context may pass on a
		// cancelled one's).
		return nil
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

// cancelCtxKey is the key the context package looks up the cancelCtx a
// context derives from by (unexported: learnt by watching context.Cause
// look), or nil if it was not learnt; an attemptTrace is then never made
// cancellable itself (see context).
var cancelCtxKey any

func init() {
	ended, cancel := context.WithCancel(context.Background())
	cancel()                       // context.Cause looks only at an ended context
	p := &keyProbe{Context: ended} // whose lookups it answers with nil
	context.Cause(p)
	cancelCtxKey = p.key
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
