package idemretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
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

// At start-up, list the actions a previous run left unfinished, to resume
// them (same key) or reconcile them with the server.
func ExampleJournal_unfinished() {
	j := journal.NewMemory()
	ctx := context.Background()
	_, _, _ = j.Reserve(ctx, journal.Record{ActionID: "pay:order-9", Key: "k-9", CreatedAt: time.Now(), State: journal.StatePending, Attempts: 2}, journal.ReuseAny)
	unfinished, _ := j.Unfinished(ctx)
	for _, r := range unfinished {
		fmt.Println(r.ActionID, r.State, "attempts:", r.Attempts)
	}
	// Output:
	// pay:order-9 pending attempts: 2
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
