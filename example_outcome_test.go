package idemretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// What happened to each payment, as the app branches on it: paid; paid
// before (the server's replay); not sent at all; maybe paid (the server
// kept answering 503); refused before sending (another amount under the
// same action).
func ExampleOutcomeOf() {
	var mu sync.Mutex
	charged := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/busy" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		if charged[key] {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		charged[key] = true
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	offline := "http://" + l.Addr().String() // nothing listens: every dial is refused
	l.Close()

	client, err := idemretry.NewClient(idemretry.WithJournal(journal.NewMemory()), idemretry.WithRequireAction(),
		idemretry.WithMaxRetries(2), idemretry.WithBackOff(func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	pay := func(action, url, amount string) {
		ctx := idemretry.WithAction(context.Background(), action)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":`+amount+`}`))
		resp, err := client.Do(req)
		if resp != nil {
			defer resp.Body.Close()
		}
		switch o := idemretry.OutcomeOf(resp, err); o.Kind {
		case idemretry.Done:
			fmt.Printf("%s: done, %d, replayed %v\n", o.Action, o.Status, o.Replayed)
		case idemretry.NotSent:
			fmt.Printf("%s: not sent (%d attempts): safe to change\n", o.Action, o.Attempts)
		case idemretry.Pending:
			fmt.Printf("%s: maybe paid, last status %d (%v): resend the same action later\n", o.Action, o.Status, o.Reason)
		case idemretry.Refused:
			fmt.Printf("%s: refused (%v), maybe paid before: %v\n", o.Action, o.Reason, o.MaybeProcessed)
		}
	}
	pay("pay:order-1", srv.URL, "100")
	pay("pay:order-1", srv.URL, "100")
	pay("pay:order-2", offline, "200")
	pay("pay:order-3", srv.URL+"/busy", "300")
	pay("pay:order-1", srv.URL, "999")
	// Output:
	// pay:order-1: done, 201, replayed false
	// pay:order-1: done, 201, replayed true
	// pay:order-2: not sent (3 attempts): safe to change
	// pay:order-3: maybe paid, last status 503 (idemretry: attempts exhausted): resend the same action later
	// pay:order-1: refused (idemretry: action reused with a different request), maybe paid before: true
}

// orders is an app's own record of its payments, which Resume's Rebuild
// reads (the journal keeps keys, never requests), and its provider's
// ledger, which Resolve asks.
type orders struct {
	url     string
	bodies  map[string]string // action id -> request body
	charged map[string]bool   // key -> charged, as the provider says
}

func (o orders) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	body, ok := o.bodies[rec.ActionID]
	if !ok {
		return nil, errors.New("no such order")
	}
	return http.NewRequestWithContext(ctx, http.MethodPost, o.url, strings.NewReader(body))
}

// Resolve asks the provider about an outcome-unknown payment's key: once it
// says whether it charged it, the journal may forget it.
func (o orders) Resolve(_ context.Context, rec journal.Record) (bool, error) {
	fmt.Printf("resolve %s: charged %v\n", rec.ActionID, o.charged[rec.Key])
	return true, nil
}

// At start-up, Resume resends what the previous run left pending (here, a
// payment charged whose answer was lost) and hands to Resolve what it may
// not send (a payment whose key window ended while the app was closed).
// The app gets each answer: the charge id is in the body.
func ExampleClient_Resume() {
	var mu sync.Mutex
	stored := map[string]string{} // key -> the answer's body
	drop := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		body, replay := stored[key]
		if !replay {
			body = fmt.Sprintf(`{"charge":"ch_%d"}`, len(stored)+1)
			stored[key] = body
		}
		lose := drop
		drop = false
		mu.Unlock()
		if lose { // charged, and the answer never reaches the app
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	}))
	defer srv.Close()
	j := journal.NewMemory() // a file journal, in a real app: it outlives the process
	app := orders{url: srv.URL, bodies: map[string]string{"pay:order-7": `{"amount":700}`}, charged: map[string]bool{"key-old": true}}

	// The previous run: order-7 was charged, its answer lost; order-6's key
	// window ended while the app was closed.
	first, _ := idemretry.NewClient(idemretry.WithJournal(j), idemretry.WithMaxRetries(0))
	req, _ := app.Rebuild(idemretry.WithAction(context.Background(), "pay:order-7"), journal.Record{ActionID: "pay:order-7"})
	if _, err := first.Do(req); err == nil {
		panic("the answer was not lost")
	}
	first.Close()
	old := journal.Record{ActionID: "pay:order-6", Key: "key-old", CreatedAt: time.Now().Add(-30 * time.Hour), State: journal.StatePending, Attempts: 1}
	j.Reserve(context.Background(), old, journal.ReuseAny)
	old.State = journal.StateUnknown
	j.Update(context.Background(), old)

	// This run, at start-up.
	client, err := idemretry.NewClient(idemretry.WithJournal(j))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	results, err := client.Resume(context.Background(), app, 1)
	if err != nil {
		panic(err)
	}
	sort.Slice(results, func(a, b int) bool { return results[a].Record.ActionID < results[b].Record.ActionID })
	for _, r := range results {
		o := r.Outcome
		switch o.Kind {
		case idemretry.Done:
			fmt.Printf("%s: %d %s, replayed %v\n", o.Action, r.Status, r.Body, o.Replayed)
		default:
			fmt.Printf("%s: %v (%v), forgotten %v\n", o.Action, o.Kind, o.Reason, r.Forgotten)
		}
	}
	// Output:
	// resolve pay:order-6: charged true
	// pay:order-6: refused (idemretry: action's outcome is unknown), forgotten true
	// pay:order-7: 201 {"charge":"ch_1"}, replayed true
}
