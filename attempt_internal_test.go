package idemretry

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry/journal"
)

// Internals of attempt.go and attemptctx.go: the request an attempt sends
// (its key, its header copy), the answers whose bodies the policy may read,
// and the attempt's context.

// The attempt builder sends no keyed method without a key, whatever the
// record it was given (issue 26, item 14: an empty key in a crafted record
// went out as a request without an Idempotency-Key); a method that is not
// keyed goes out without one.
func TestNewAttemptRefusesAKeyedMethodWithoutAKey(t *testing.T) {
	t.Parallel()
	tr, err := NewTransport(nil, WithJournal(journal.NewMemory()), WithKeyedMethods(http.MethodGet), WithUnkeyedMethods(http.MethodPatch))
	require.NoError(t, err)
	defer tr.Close()
	for _, tc := range []struct {
		method string
		keyed  bool
	}{{http.MethodPost, true}, {http.MethodGet, true}, {"", true}, {http.MethodPatch, false}, {http.MethodPut, false}} {
		req, err := http.NewRequest(tc.method, "http://127.0.0.1:1/pay", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		req.Method = tc.method // "" is GET to net/http
		b, err := newBody(req, 1<<20)
		require.NoError(t, err)
		out, err := tr.newAttempt(req, &b, "", nil)
		if tc.keyed {
			require.ErrorIs(t, err, ErrInvalidKey, "%q without a key", tc.method)
			require.Nil(t, out)
		} else {
			require.NoError(t, err, "%q, which is not keyed", tc.method)
			require.Empty(t, out.Header.Values(DefaultKeyHeader))
		}
		b.close()
	}
}

// The default policy reads no body but on the statuses where a server
// refuses a key as reused; any other policy may read any body.
func TestMayReadBody(t *testing.T) {
	t.Parallel()
	custom := func(_ context.Context, resp *http.Response, err error) bool { return false }
	for _, tc := range []struct {
		policy RetryPolicy
		status int
		want   bool
	}{
		{DefaultRetryPolicy, 201, false},
		{DefaultRetryPolicy, 503, false},
		{DefaultRetryPolicy, 400, true},
		{DefaultRetryPolicy, 409, true},
		{DefaultRetryPolicy, 422, true},
		{custom, 201, true},
		{custom, 503, true},
	} {
		if got := mayReadBody(tc.policy, &http.Response{StatusCode: tc.status}); got != tc.want {
			t.Errorf("status %d: mayReadBody = %v, want %v", tc.status, got, tc.want)
		}
	}
}

// cloneHeader is http.Header.Clone without the dropped header (under any
// spelling), in one pass: whatever the number of values (within vals,
// beyond it, one header with more than vals holds), nil and empty value
// slices kept as Clone keeps them, and no value slice able to overwrite
// another's or the caller's by an append.
func TestCloneHeaderIsCloneWithoutTheKey(t *testing.T) {
	t.Parallel()
	const name = "Idempotency-Key"
	for _, nv := range []int{0, 1, 3, 7, 8, 9, 20} {
		for _, many := range []bool{false, true} {
			h := http.Header{"Nil": nil, "Empty": {}, "idempotency-key": {"old"}, name: {"older"}}
			for i := 0; i < nv; i++ {
				k := "X-H" + strings.Repeat("i", i%4)
				if many {
					k = "X-Many"
				}
				h[k] = append(h[k], strings.Repeat("v", i))
			}
			want := h.Clone()
			delete(want, "idempotency-key")
			delete(want, name)
			for _, drop := range []string{"", name} {
				var vals [8]string
				got, spare := cloneHeader(h, drop, vals[:])
				if drop == "" {
					if spare != nil || !reflect.DeepEqual(got, h.Clone()) {
						t.Fatalf("nv %d many %v: clone %v spare %v, want %v", nv, many, got, spare, h)
					}
					continue
				}
				if len(spare) != 1 || cap(spare) != 1 {
					t.Fatalf("spare %d/%d, want 1/1", len(spare), cap(spare))
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("nv %d many %v: clone %v, want %v", nv, many, got, want)
				}
				if got["Nil"] != nil || got["Empty"] == nil {
					t.Fatalf("nil and empty values not kept: %#v %#v", got["Nil"], got["Empty"])
				}
				for k, vv := range got {
					if cap(vv) != len(vv) {
						t.Fatalf("%s: cap %d > len %d", k, cap(vv), len(vv))
					}
					got[k] = append(vv, "appended")
				}
				spare[0] = "key"
				got[name] = spare
				if !reflect.DeepEqual(h, func() http.Header {
					w := want.Clone()
					w["idempotency-key"], w[name] = []string{"old"}, []string{"older"}
					return w
				}()) {
					t.Fatalf("the caller's header changed: %v", h)
				}
				for k, vv := range got {
					if k != name && vv[len(vv)-1] != "appended" {
						t.Fatalf("%s overwritten: %v", k, vv)
					}
				}
			}
		}
	}
}

type probeKey struct{}

// An attempt's context is its attemptTrace (no context of its own for the
// trace): httptrace finds the attempt's hooks in it, every other value,
// the deadline, Done and Err are the caller's; a caller's context that
// already carries a trace gets httptrace's own composition under it.
func TestAttemptTraceIsTheAttemptsContext(t *testing.T) {
	t.Parallel()
	if clientTraceKey == nil {
		t.Fatal("httptrace's key was not learnt: every attempt pays for a context of its own")
	}
	parent, cancel := context.WithTimeout(context.WithValue(context.Background(), probeKey{}, "v"), time.Hour)
	tr := new(attemptTrace)
	tr.trace.WroteRequest = tr.wrote
	ctx := tr.withTrace(parent)
	if ctx != context.Context(tr) {
		t.Fatalf("withTrace made a context of its own: %T", ctx)
	}
	if httptrace.ContextClientTrace(ctx) != &tr.trace {
		t.Fatal("httptrace does not find the attempt's hooks")
	}
	if ctx.Value(probeKey{}) != "v" {
		t.Fatal("the caller's values are lost")
	}
	dl, ok := ctx.Deadline()
	pdl, _ := parent.Deadline()
	if !ok || !dl.Equal(pdl) || ctx.Done() != parent.Done() || ctx.Err() != nil {
		t.Fatal("deadline or Done are not the caller's")
	}
	// net/http's own cancel under it is registered with the caller's.
	child, childCancel := context.WithCancel(ctx)
	defer childCancel()
	cancel()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context made under the attempt's did not end with the caller's")
	}
	if ctx.Err() != context.Canceled {
		t.Fatalf("Err %v", ctx.Err())
	}

	// A caller's trace is composed with the attempt's, by httptrace.
	var callerWrites atomic.Int32
	withCaller := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { callerWrites.Add(1) },
	})
	tr2 := new(attemptTrace)
	tr2.trace.WroteRequest = tr2.wrote
	ctx2 := tr2.withTrace(withCaller)
	if ctx2 != context.Context(tr2) || attemptOf(ctx2) != tr2 {
		t.Fatal("the attempt is not in its context, where OutcomeOf looks for it")
	}
	httptrace.ContextClientTrace(ctx2).WroteRequest(httptrace.WroteRequestInfo{})
	if callerWrites.Load() != 1 || tr2.writes.Load() != 1 {
		t.Fatalf("caller saw %d writes, attempt %d; want 1 and 1", callerWrites.Load(), tr2.writes.Load())
	}
}

// The attempt's context is a context.WithCancel over the attemptTrace,
// under a caller's context that can never end (Done nil, as for
// context.Background) as under one that can: contexts derived from it
// (net/http derives one per request) are linked to it with no goroutine
// each; end cancels them and may be called again; the caller's own end
// reaches the attempt too.
func TestAttemptContextIsCancellableUnderAnyCallerContext(t *testing.T) {
	never := context.WithValue(context.Background(), probeKey{}, "v")
	can, cancelCan := context.WithCancel(never)
	defer cancelCan()
	for _, tc := range []struct {
		name     string
		parent   context.Context
		byCaller func()
	}{{"never ends", never, nil}, {"can end", can, cancelCan}} {
		t.Run(tc.name, func(t *testing.T) {
			tr := new(attemptTrace)
			ctx := tr.context(tc.parent)
			if ctx.Done() == nil || ctx.Err() != nil || ctx.Value(probeKey{}) != "v" || httptrace.ContextClientTrace(ctx) != &tr.trace {
				t.Fatal("the attempt's context lost its Done, Err, values or trace")
			}
			before := runtime.NumGoroutine()
			var children []context.Context
			for range 50 {
				c, cancel := context.WithCancelCause(ctx)
				defer cancel(nil)
				children = append(children, c)
			}
			if d := runtime.NumGoroutine() - before; d >= 50 {
				t.Fatalf("%d goroutines started for 50 derived contexts", d)
			}
			if tc.byCaller != nil {
				tc.byCaller()
			} else {
				tr.end()
				tr.end()
			}
			for i, c := range children {
				select {
				case <-c.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("derived context %d did not end with the attempt", i)
				}
			}
			if ctx.Err() != context.Canceled {
				t.Fatalf("Err after the end: %v", ctx.Err())
			}
		})
	}
}
