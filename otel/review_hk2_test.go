package otel_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemretry/idemretry"
	iotel "github.com/idemretry/idemretry/otel"
)

// hK2's review: a large payment (keyed fingerprint) left pending; its
// journal's fingerprint.key is deleted; the resend is refused with an
// *ActionError, nothing sent. The span names why, as it does for a
// fingerprint mismatch: idemretry.reason fingerprint_uncheckable.
func TestReviewHK2UncheckableReason(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, n int) { w.WriteHeader(http.StatusServiceUnavailable) })
	h := newHarness(t, nil, idemretry.WithMaxRetries(0))
	body := `{"amount":100,"note":"` + strings.Repeat("x", 80<<10) + `"}`
	resp, _, err := h.post(context.Background(), srv.URL+"/payments", action, body)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first post: %v %v", resp, err)
	}
	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(h.dir, "fingerprint.key")); err != nil {
		t.Fatal(err)
	}
	h.tr = h.transport(idemretry.WithMaxRetries(0))
	_, _, err = h.post(context.Background(), srv.URL+"/payments", action, body)
	if err == nil {
		t.Skip("this CPU makes plain fingerprints: the resend is checked")
	}
	var ae *idemretry.ActionError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "cannot be checked") {
		t.Fatalf("resend: %v, want an *ActionError (cannot be checked)", err)
	}
	ended := h.sr.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2", len(ended))
	}
	wantAttrs(t, "span", ended[1].Attributes(), iotel.ReasonKey.String("fingerprint_uncheckable"), iotel.MaybeProcessedKey.Bool(true))
	srv.mu.Lock()
	sent := len(srv.keys)
	srv.mu.Unlock()
	if sent != 1 {
		t.Fatalf("%d requests sent, want 1", sent)
	}
}
