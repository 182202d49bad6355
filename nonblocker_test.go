package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// stallingMemory embeds a Memory, and so its NeverBlocks method, but its
// Reserve stalls until its context ends: the claim that a Memory never
// blocks must not pass to it, or the journal timeout would not bound it.
type stallingMemory struct{ *journal.Memory }

func (s stallingMemory) Reserve(ctx context.Context, _ journal.Record, _ journal.ReserveMode) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// The journal timeout bounds a journal that embeds journal.Memory: the
// Transport skips its timers only for a journal that says of itself that
// it never blocks (journal.NonBlocker), never for one that inherits the
// method.
func TestNonBlockerClaimIsNotInherited(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(stallingMemory{journal.NewMemory()}),
		idemretry.WithJournalTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, journal.ErrUnavailable) {
			t.Fatalf("RoundTrip: %v, want journal.ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RoundTrip still waiting for the stalled journal 30 s after a 50 ms journal timeout")
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests sent without a reserved key", n)
	}
}
