package idemretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemretry/idemretry"
)

// A payment that meets two 503s and then succeeds: three attempts, one key.
func Example() {
	var mu sync.Mutex
	keys := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys[r.Header.Get("Idempotency-Key")]++
		n := keys[r.Header.Get("Idempotency-Key")]
		mu.Unlock()
		if n < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"status":"paid"}`)
	}))
	defer srv.Close()

	client, err := idemretry.NewClient(
		idemretry.WithJournal(journal.NewMemory()), // the default is a file journal
		idemretry.WithBackOff(func() backoff.BackOff { return idemretry.NewFullJitter(time.Millisecond, 10*time.Millisecond, nil) }),
	)
	if err != nil {
		panic(err)
	}
	defer client.Close()

	ctx := idemretry.WithAction(context.Background(), "pay:order-A-1001")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":129900}`))
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	for _, n := range keys {
		fmt.Println("distinct keys: 1, attempts with it:", n)
	}
	// Output:
	// 201 {"status":"paid"}
	// distinct keys: 1, attempts with it: 3
}

// The ceilings of the default full-jitter backoff: each wait is drawn
// uniformly below them, 15.5 s in the worst case.
func ExampleNewFullJitter() {
	b := idemretry.NewFullJitter(idemretry.DefaultBaseDelay, idemretry.DefaultMaxDelay, maxRand{})
	var total time.Duration
	for retry := 1; retry <= idemretry.DefaultMaxRetries; retry++ {
		w := b.NextBackOff().Round(time.Millisecond) // maxRand draws just below the ceiling
		total += w
		fmt.Printf("retry %d waits below %v\n", retry, w)
	}
	fmt.Println("worst case in all:", total)
	// Output:
	// retry 1 waits below 500ms
	// retry 2 waits below 1s
	// retry 3 waits below 2s
	// retry 4 waits below 4s
	// retry 5 waits below 8s
	// worst case in all: 15.5s
}

// A restart: the first process loses the answer and stops; the second,
// over the same journal directory, finds the action unfinished and resends
// it with the same key, and the server replays its stored answer.
func ExampleNewTransport() {
	var mu sync.Mutex
	charged := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		replay := charged[key]
		charged[key] = true
		mu.Unlock()
		if !replay { // charge, then lose the answer on the way back
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	dir, _ := os.MkdirTemp("", "journal")
	defer os.RemoveAll(dir)
	ctx := idemretry.WithAction(context.Background(), "pay:order-A-1001")
	send := func(t *idemretry.Transport) (*http.Response, error) {
		client := &http.Client{Transport: t}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":129900}`))
		return client.Do(req)
	}

	// The first run gives up at once (no retries), as if it were killed.
	first, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir), idemretry.WithMaxRetries(0))
	if err != nil {
		panic(err)
	}
	if _, err := send(first); err != nil {
		fmt.Println("first run: answer lost")
	}
	first.Close()

	// The next run starts over the same journal.
	second, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	if err != nil {
		panic(err)
	}
	defer second.Close()
	unfinished, _ := second.Journal().Unfinished(ctx)
	fmt.Println("unfinished at start-up:", unfinished[0].ActionID)
	resp, err := send(second)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("second run:", resp.StatusCode, "replayed:", idemretry.IsReplay(resp), "charges:", len(charged))
	// Output:
	// first run: answer lost
	// unfinished at start-up: pay:order-A-1001
	// second run: 201 replayed: true charges: 1
}

// A payment app refuses to send a payment that names no action: the
// request fails with ErrActionRequired and the server receives nothing.
// Named, it goes out.
func ExampleWithRequireAction() {
	var received atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client, err := idemretry.NewClient(idemretry.WithJournal(journal.NewMemory()), idemretry.WithRequireAction())
	if err != nil {
		panic(err)
	}
	defer client.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":129900}`))
	_, err = client.Do(req)
	fmt.Println("unnamed: ErrActionRequired:", errors.Is(err, idemretry.ErrActionRequired))
	fmt.Println("requests the server received:", received.Load())

	ctx := idemretry.WithAction(context.Background(), "pay:order-A-1001")
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":129900}`))
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println("named:", resp.StatusCode)
	fmt.Println("requests the server received:", received.Load())
	// Output:
	// unnamed: ErrActionRequired: true
	// requests the server received: 0
	// named: 201
	// requests the server received: 1
}

// A double tap: the same unnamed payment twice within the duplicate
// window. The second is sent with the first's key, and the server, which
// stores each key's answer as Stripe does, replays it: one charge.
func ExampleWithDuplicateWindow() {
	var mu sync.Mutex
	answers := map[string]string{} // key: the charge made under it
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		charge, replay := answers[key]
		if !replay {
			charge = fmt.Sprintf(`{"charge":"ch_%d"}`, len(answers)+1)
			answers[key] = charge
		} else {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, charge)
	}))
	defer srv.Close()

	client, err := idemretry.NewClient(idemretry.WithJournal(journal.NewMemory()), idemretry.WithDuplicateWindow(30*time.Second))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	for tap := 1; tap <= 2; tap++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":129900}`))
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println("tap", tap, resp.StatusCode, string(body), "replayed:", idemretry.IsReplay(resp))
	}
	mu.Lock()
	fmt.Println("charges:", len(answers))
	mu.Unlock()
	// Output:
	// tap 1 201 {"charge":"ch_1"} replayed: false
	// tap 2 201 {"charge":"ch_1"} replayed: true
	// charges: 1
}
