package idemretry_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"

	idemretry "github.com/idemretry/idemretry/mobile"
)

// A payment made with an ActionID is charged once, however often it is
// sent: here the user taps Pay twice, and the second Send carries the same
// Idempotency-Key, so the server replays its answer. An app calls the same
// methods from Kotlin or Swift through the bindings gomobile bind makes.
func ExampleClient() {
	// A payment server that charges each Idempotency-Key once and replays
	// its answer to that key afterwards, as Stripe does.
	var mu sync.Mutex
	charges := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if answer, ok := charges[key]; ok {
			w.Header().Set("Idempotent-Replayed", "true")
			_, _ = io.WriteString(w, answer)
			return
		}
		charges[key] = fmt.Sprintf(`{"charge":"ch_%d"}`, len(charges)+1)
		_, _ = io.WriteString(w, charges[key])
	}))
	defer srv.Close()

	// The journal directory: the app's files directory on Android,
	// Application Support on iOS.
	files, err := os.MkdirTemp("", "app-files")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(files)
	c, err := idemretry.NewClient(filepath.Join(files, "idemretry"), nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	for range 2 { // two taps on Pay
		req := idemretry.NewRequest("POST", srv.URL+"/charges")
		req.Headers.Set("Content-Type", "application/json")
		req.Body = []byte(`{"amount":1000}`)
		req.ActionID = "pay:order-1001" // made once, when the checkout screen opened
		resp, err := c.Send(req)
		switch idemretry.ErrorKind(err) {
		case idemretry.KindNone:
			fmt.Printf("%d %s replayed=%v\n", resp.Status, resp.Body, resp.Replayed)
		case idemretry.KindMaybeProcessed, idemretry.KindGaveUp, idemretry.KindNetwork, idemretry.KindParked:
			fmt.Println("not known yet: send it again later with the same ActionID")
		default:
			fmt.Println("not sent:", idemretry.FailureOf(err).Message)
		}
	}
	unfinished, err := c.Unfinished()
	if err != nil {
		panic(err)
	}
	fmt.Println("unfinished:", unfinished.Len())
	// Output:
	// 200 {"charge":"ch_1"} replayed=false
	// 200 {"charge":"ch_1"} replayed=true
	// unfinished: 0
}
