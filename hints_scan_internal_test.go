package idemretry

import (
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

// The hints read in one pass over a small header (scanHeaders) and by name
// over a larger one find what a lookup of each hint's name finds (the
// reference below, every line of each name): over random headers of 0 to
// 20 names, with the hints' names, other spellings of them, and values
// read, misread and absent.
func TestHintsScanFindsWhatLookupsFind(t *testing.T) {
	names := []string{"Content-Type", "Date", "Content-Length", "X-Request-Id",
		"stripe-should-retry", "IDEMPOTENT-REPLAYED", "Idempotent-replayed"}
	names = append(names, retryHeaders[:]...)
	names = append(names, replayHeaders[:]...)
	for i := range 16 {
		names = append(names, "X-Other-"+strings.Repeat("a", i))
	}
	values := []string{"true", "TRUE", ` "true" `, "false", "False", `"false"`, "yes", "", "falſe", "tru", `"`, "true\t"}
	r := rand.New(rand.NewPCG(1, 2))
	small, large := 0, 0
	for range 20000 {
		h := http.Header{}
		for range r.IntN(21) {
			var vv []string
			switch r.IntN(8) {
			case 0: // nil, as Header.Clone keeps it
			case 1:
				vv = []string{}
			default:
				for range 1 + r.IntN(2) {
					vv = append(vv, values[r.IntN(len(values))])
				}
			}
			h[names[r.IntN(len(names))]] = vv
		}
		if len(h) <= scanHeaders {
			small++
		} else {
			large++
		}
		resp := &http.Response{Header: h}
		if got, want := IsReplay(resp), refIsReplay(h); got != want {
			t.Fatalf("IsReplay(%q) = %v, lookups say %v", h, got, want)
		}
		gr, gok := retryHint(h)
		wr, wok := refRetryHint(h)
		if gr != wr || gok != wok {
			t.Fatalf("retryHint(%q) = %v, %v; lookups say %v, %v", h, gr, gok, wr, wok)
		}
	}
	if small < 1000 || large < 1000 {
		t.Fatalf("headers drawn: %d small, %d large; want both paths taken", small, large)
	}
}

func refIsReplay(h http.Header) bool {
	for _, name := range replayHeaders {
		for _, v := range h.Values(name) {
			if strings.EqualFold(unquote(v), "true") {
				return true
			}
		}
	}
	return false
}

func refRetryHint(h http.Header) (retry, ok bool) {
	for _, name := range retryHeaders {
		for _, v := range h.Values(name) {
			switch strings.ToLower(unquote(v)) {
			case "false":
				return false, true
			case "true":
				retry, ok = true, true
			}
		}
	}
	return retry, ok
}
