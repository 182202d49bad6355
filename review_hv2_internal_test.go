package idemretry

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
)

// The one-pass scan (at most scanHeaders names) and the lookups (above)
// find the same hints in headers net/http's client builds from real wire
// answers over loopback: random header sections of 0 to 12 lines with
// the hints' names in several spellings (canonicalised by net/http or
// not), repeated lines, empty values, folded lines and padding names, so
// that sections of exactly 8 and 9 names come up. Each header is read as
// it came (whichever path its size takes) and again padded past
// scanHeaders (the lookups), and both agree with the reference.
//
// Found in review hv2 (7ce9851; was TestHV2WireHeadersScanMatchesLookups).
func TestHintsWireHeadersScanMatchesLookups(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answers := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					break
				}
				io.Copy(io.Discard, req.Body)
				if _, err := io.WriteString(c, <-answers); err != nil {
					break
				}
			}
			c.Close()
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	names := []string{"X-Should-Retry", "x-should-retry", "STRIPE-SHOULD-RETRY", "Transient-Error", "transient-error",
		"X_Should_Retry", "Idempotent-Replayed", "idempotency-replayed", "X-IDEMPOTENCY-REPLAYED", "Idempotency-Replay",
		"x-idempotency-replay", "Idempotent_Replayed", "Content-Type", "Date", "X-Request-Id"}
	values := []string{"true", "false", " TRUE ", `"false"`, `"true"`, "", "maybe", "False", "tru"}
	r := rand.New(rand.NewPCG(7, 9))
	bySize, refused := map[int]int{}, 0
	for i := range 1500 {
		var b strings.Builder
		b.WriteString("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n")
		lines := r.IntN(13)
		for range lines {
			name, value := names[r.IntN(len(names))], values[r.IntN(len(values))]
			switch r.IntN(6) {
			case 0:
				name = fmt.Sprintf("X-Pad-%d", r.IntN(10))
			case 1: // folded onto a continuation line
				fmt.Fprintf(&b, "%s:\r\n %s\r\n", name, value)
				continue
			}
			fmt.Fprintf(&b, "%s: %s\r\n", name, value)
		}
		b.WriteString("\r\n")
		wire := b.String()
		answers <- wire
		resp, err := client.Get("http://" + ln.Addr().String() + "/" + fmt.Sprint(i))
		if err != nil { // a section net/http refuses
			select {
			case <-answers:
			default:
			}
			refused++
			continue
		}
		resp.Body.Close()
		h := resp.Header
		bySize[len(h)]++

		wantRetry, wantOK := refRetryHint(h)
		wantReplay := refIsReplay(h)
		padded := h.Clone()
		for j := range scanHeaders + 1 {
			padded[fmt.Sprintf("X-Hv2-Pad-%d", j)] = []string{"1"}
		}
		for _, hh := range []http.Header{h, padded} {
			gr, gok := retryHint(hh)
			if gr != wantRetry || gok != wantOK {
				t.Fatalf("wire %q: retryHint(%d names) = %v, %v; want %v, %v", wire, len(hh), gr, gok, wantRetry, wantOK)
			}
			if got := IsReplay(&http.Response{Header: hh}); got != wantReplay {
				t.Fatalf("wire %q: IsReplay(%d names) = %v; want %v", wire, len(hh), got, wantReplay)
			}
		}
	}
	ln.Close()
	client.Transport.(*http.Transport).CloseIdleConnections()
	<-done
	if refused > 100 {
		t.Fatalf("%d of 1500 answers refused by net/http", refused)
	}
	if bySize[scanHeaders] == 0 || bySize[scanHeaders+1] == 0 {
		t.Fatalf("header sizes drawn: %v; want %d and %d names among them", bySize, scanHeaders, scanHeaders+1)
	}
}
