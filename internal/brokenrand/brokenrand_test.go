package brokenrand_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/internal/brokenrand" // initialised before idemretry, which imports journal (after "internal" in import path order)
	"github.com/idemretry/idemretry/journal"
)

// A crypto/rand.Reader replaced by a package initialised before idemretry
// gives RoundTrip an error, with nothing sent, and does not end the
// process (crypto/rand.Read is fatal on a Reader's error since Go 1.24).
func TestReplacedRandReaderBeforeInitIsAnError(t *testing.T) {
	var sent atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Store(true)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournal(journal.NewMemory()))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	req, err := http.NewRequestWithContext(idemretry.WithAction(context.Background(), "pay:rand-order"), http.MethodPost, srv.URL, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("RoundTrip minted a key from a failing Reader")
	}
	if !errors.Is(err, brokenrand.ErrNoEntropy) || sent.Load() {
		t.Fatalf("RoundTrip: %v (sent: %v), want the Reader's error and nothing sent", err, sent.Load())
	}
}
