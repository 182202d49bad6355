package idemretry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemretry/idemretry/journal"
)

// newUUIDKey's keys are canonical random (version 4, RFC 9562 variant)
// UUIDs, as uuid.NewRandom makes them, and no two alike.
func TestNewUUIDKeyIsCanonicalV4(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		k, err := newUUIDKey()
		if err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(k)
		if err != nil {
			t.Fatalf("%q: %v", k, err)
		}
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != k {
			t.Fatalf("%q: version %d, variant %v, canonical %q", k, u.Version(), u.Variant(), u.String())
		}
		if seen[k] {
			t.Fatalf("%q made twice", k)
		}
		seen[k] = true
	}
}

// IsReplay and the retry hints look the header names up as they are
// written, without canonicalising them: each must be in canonical form, as
// net/http stores the headers it reads, or the lookup would miss.
func TestHintHeaderNamesAreCanonical(t *testing.T) {
	for _, names := range [][]string{replayHeaders[:], retryHeaders[:]} {
		for _, name := range names {
			if c := http.CanonicalHeaderKey(name); c != name {
				t.Errorf("%q is not canonical (%q)", name, c)
			}
		}
	}
}

// The default policy reads no body but on the statuses where a server
// refuses a key as reused; any other policy may read any body.
func TestMayReadBody(t *testing.T) {
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

// appendURL writes the bytes of URL.String, which the fingerprint hashes:
// one byte of difference would give a stored action another fingerprint.
func TestAppendURLIsURLString(t *testing.T) {
	for _, s := range appendURLSeeds {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if got, want := string(appendURL([]byte("x"), u)), "x"+u.String(); got != want {
			t.Errorf("%q: appendURL %q, String %q", s, got, want)
		}
	}
	// Hand-made URLs, which Parse would not give.
	for _, u := range []*url.URL{
		{Scheme: "http", Host: "h", Path: "a/b"},
		{Scheme: "http", Host: "h", Path: "/a b", ForceQuery: true},
		{Scheme: "http", Host: "h", Path: "/p", RawQuery: "a=1&b=%20", Fragment: "f"},
		{Scheme: "https", Host: "h", Path: "/p", OmitHost: true},
		{Scheme: "http", Host: "h", Path: "*"},
		{Scheme: "http", Host: "h", Path: "/ü"},
		{Scheme: "http", Host: "h", Path: "/a%2Fb", RawPath: "/a%2Fb"},
		{Scheme: "http", Host: "[::1]:80", Path: "/"},
		{Scheme: "http", Host: "h", Path: "/", User: url.UserPassword("u", "p")},
	} {
		if got, want := string(appendURL(nil, u)), u.String(); got != want {
			t.Errorf("%#v: appendURL %q, String %q", u, got, want)
		}
	}
}

var appendURLSeeds = []string{
	"http://stub.invalid/charges", "https://api.example.com/v1/payments?expand=charge",
	"http://127.0.0.1:8080/", "http://[::1]:80/x", "http://h", "http://h?", "http://h/?a=b#frag",
	"http://h/a%20b", "http://h/a%2Fb", "http://user:pw@h/p", "mailto:x@y", "/relative/path",
	"http://h/~user/a-b_c.d", "http://h/a:b@c;d=e", "HTTP://H/P", "http://h/*", "http://h/%7E",
	"http://xn--nxasmq6b.example/p", "http://h/p?q=%ZZ", "http://h:/p", "//h/p",
}

func FuzzAppendURL(f *testing.F) {
	for _, s := range appendURLSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		if got, want := string(appendURL(nil, u)), u.String(); got != want {
			t.Fatalf("%q: appendURL %q, String %q", s, got, want)
		}
	})
}

// Fingerprinting reads an in-memory body in place (body.writeTo) instead of
// a copy from GetBody: the fingerprint must be the one of the bytes the
// first attempt sends, as the copy gave it, for every body http.NewRequest
// knows (at any size, across the read chunk, and for a reader already
// partly read before NewRequest), for a body read into memory, and for one
// it does not know (which still goes through GetBody); and reading it must
// leave what the first attempt sends untouched.
func TestFingerprintInPlaceIsTheCopysFingerprint(t *testing.T) {
	for _, size := range []int{0, 1, 1024, 2048, 2049, 5000, 70000} {
		payload := bytes.Repeat([]byte("0123456789abcdefghij"), size/20+1)[:size]
		for _, skip := range []int{0, 1, size / 2} {
			if skip > size {
				continue
			}
			makers := map[string]func() io.Reader{
				"bytes.Reader": func() io.Reader {
					r := bytes.NewReader(payload)
					r.Seek(int64(skip), io.SeekStart)
					return r
				},
				"strings.Reader": func() io.Reader {
					r := strings.NewReader(string(payload))
					r.Seek(int64(skip), io.SeekStart)
					return r
				},
				"bytes.Buffer": func() io.Reader {
					b := bytes.NewBuffer(append([]byte(nil), payload...))
					b.Next(skip)
					return b
				},
				"unknown": func() io.Reader { // buffered into memory by newBody
					return io.MultiReader(bytes.NewReader(payload[skip:]))
				},
			}
			for name, mk := range makers {
				req, err := http.NewRequest(http.MethodPost, "http://example.test/pay", mk())
				if err != nil {
					t.Fatal(err)
				}
				want := sha256.Sum256(payload[skip:])
				// The fingerprint as it was computed before: the SHA-256 of
				// a GetBody copy.
				var viaCopy [32]byte
				if req.GetBody != nil {
					c, _ := req.GetBody()
					if c == http.NoBody || c == nil {
						viaCopy = sha256.Sum256(nil)
					} else {
						all, _ := io.ReadAll(c)
						viaCopy = sha256.Sum256(all)
					}
				} else {
					viaCopy = want
				}
				if viaCopy != want {
					t.Fatalf("%s size %d skip %d: the GetBody copy is not the unread body", name, size, skip)
				}
				b, err := newBody(req, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				fp, err := fingerprint(req, &b)
				if err != nil {
					t.Fatal(err)
				}
				var ref body
				if size-skip > 0 {
					ref = body{getBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(payload[skip:])), nil }}
				}
				wantFP, err := fingerprint(req, &ref) // through GetBody: the custom closure is not an in-memory reader
				if err != nil {
					t.Fatal(err)
				}
				if fp != wantFP {
					t.Errorf("%s size %d skip %d: fingerprint in place %x, through a copy %x", name, size, skip, fp, wantFP)
				}
				first, err := b.next()
				if err != nil {
					t.Fatal(err)
				}
				sent, _ := io.ReadAll(first)
				if !bytes.Equal(sent, payload[skip:]) {
					t.Errorf("%s size %d skip %d: the first attempt sends %d bytes, want %d", name, size, skip, len(sent), size-skip)
				}
				b.close()
			}
		}
	}
}

// A body whose GetBody the Transport does not know is fingerprinted from
// its GetBody copy, as before: a NopCloser around a reader that is not one
// of http.NewRequest's.
func TestFingerprintOtherBodyUsesGetBody(t *testing.T) {
	payload := []byte(`{"amount":1}`)
	req, err := http.NewRequest(http.MethodPost, "http://example.test/pay", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Body = io.NopCloser(io.LimitReader(strings.NewReader("not what GetBody gives"), 100))
	calls := 0
	req.GetBody = func() (io.ReadCloser, error) {
		calls++
		return io.NopCloser(bytes.NewReader(payload)), nil
	}
	b, err := newBody(req, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	fp, err := fingerprint(req, &b)
	if err != nil {
		t.Fatal(err)
	}
	ref := body{getBody: req.GetBody}
	want, _ := fingerprint(req, &ref)
	if calls != 2 || fp != want {
		t.Errorf("GetBody called %d times (want 2), fingerprint %x want %x", calls, fp, want)
	}
}

// cloneHeader is http.Header.Clone without the dropped header (under any
// spelling), in one pass: whatever the number of values (within vals,
// beyond it, one header with more than vals holds), nil and empty value
// slices kept as Clone keeps them, and no value slice able to overwrite
// another's or the caller's by an append.
func TestCloneHeaderIsCloneWithoutTheKey(t *testing.T) {
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

// An id and its digest form name one action (a hashing journal lists it by
// its digest): whichever arrives first leads, and the other joins, in both
// orders; the flights then land and the next request leads anew.
func TestFlightsIDAndDigestShareOneFlight(t *testing.T) {
	fp := journal.Fingerprint{1}
	for _, order := range [][2]string{{"pay:1", journal.Digest("pay:1")}, {journal.Digest("pay:1"), "pay:1"}} {
		var fs flights
		f, lead, _ := fs.join(order[0], fp)
		if !lead {
			t.Fatalf("%q: first request does not lead", order[0])
		}
		g, lead, mismatch := fs.join(order[1], fp)
		if lead || mismatch || g != f {
			t.Fatalf("%q after %q: lead %v, mismatch %v, same flight %v; want it to join", order[1], order[0], lead, mismatch, g == f)
		}
		if _, lead, _ := fs.join("pay:2", fp); !lead {
			t.Fatal("another action joined pay:1's flight")
		}
		if _, lead, _ := fs.join(journal.Digest("pay:3"), fp); !lead {
			t.Fatal("another action's digest joined a flight")
		}
		if n := fs.land(f); n != 1 {
			t.Fatalf("land: %d joiners, want 1", n)
		}
		if _, lead, _ := fs.join(order[1], fp); !lead {
			t.Fatalf("%q after the flight landed: does not lead", order[1])
		}
	}
}

// A request with the same id and another fingerprint cannot join, whether
// it names the action by its id or its digest.
func TestFlightsDigestMismatch(t *testing.T) {
	var fs flights
	fs.join("pay:1", journal.Fingerprint{1})
	if _, _, mismatch := fs.join(journal.Digest("pay:1"), journal.Fingerprint{2}); !mismatch {
		t.Fatal("a digest with another fingerprint joined")
	}
}

// WithAction's context (one allocation, not WithValue's two) behaves as
// WithValue's: the innermost id wins, other values and cancellation come
// from the parent, and contexts derived from it register with the parent's
// cancellation instead of starting a goroutine each, as they would for a
// Context type the context package does not know.
func TestWithActionIsAContextValue(t *testing.T) {
	type otherKey struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), otherKey{}, "v"))
	defer cancel()
	ctx := WithAction(parent, "pay:1")
	inner := context.WithValue(WithAction(ctx, "pay:2"), otherKey{}, "w")
	if id, ok := ActionFromContext(ctx); !ok || id != "pay:1" {
		t.Errorf("ActionFromContext = %q, %v; want pay:1", id, ok)
	}
	if id, ok := ActionFromContext(inner); !ok || id != "pay:2" {
		t.Errorf("nested: ActionFromContext = %q, %v; want pay:2", id, ok)
	}
	if v := ctx.Value(otherKey{}); v != "v" {
		t.Errorf("the parent's value: %v", v)
	}
	if _, ok := ActionFromContext(WithAction(ctx, "")); ok {
		t.Error("an empty id is reported as set")
	}
	if _, ok := ActionFromContext(parent); ok {
		t.Error("an id is reported where none was set")
	}
	if s := fmt.Sprint(ctx); !strings.Contains(s, `WithAction("pay:1")`) {
		t.Errorf("String = %s", s)
	}
	before := runtime.NumGoroutine()
	var derived []context.Context
	for range 100 {
		d, c := context.WithCancel(inner)
		defer c()
		derived = append(derived, d)
	}
	if n := runtime.NumGoroutine(); n >= before+50 {
		t.Errorf("%d goroutines after deriving 100 contexts, %d before: derived contexts do not find the parent's cancellation", n, before)
	}
	cancel()
	for _, d := range derived {
		select {
		case <-d.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a derived context was not cancelled with the parent")
		}
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("Err = %v", ctx.Err())
	}
}

// Printing a WithAction context names a parent without a String method by
// its type, as WithValue's does, never by its fields (which may hold
// secrets, and may be written meanwhile); a nil parent gives a context that
// http.NewRequestWithContext refuses, not one that fails deep in a send.
func TestWithActionStringAndNilParent(t *testing.T) {
	type appCtx struct {
		context.Context
		apiToken string
	}
	parent := &appCtx{Context: context.Background(), apiToken: "sk_live_secret"}
	s := fmt.Sprint(WithAction(parent, "pay:1"))
	if strings.Contains(s, "sk_live_secret") || !strings.HasSuffix(s, `.WithAction("pay:1")`) {
		t.Errorf("String = %s", s)
	}
	//lint:ignore SA1012 a nil parent is the point
	ctx := WithAction(nil, "pay:1")
	if _, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:1/", nil); err == nil {
		t.Error("WithAction(nil, id) made a context that http.NewRequestWithContext accepts")
	}
}
