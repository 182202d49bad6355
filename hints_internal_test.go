package idemretry

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Internals of hints.go: the hints' lookups by name against a reference,
// over random headers and headers net/http built from wire bytes.

// The hints find what the reference below finds (h.Values of each hint's
// name, every line of it): over random headers of 0 to 20 names, with the
// hints' names, other spellings of them, and values read, misread and
// absent.
//
// Was TestHintsScanFindsWhatLookupsFind, while small headers had a scan of their own (issue 27 removed it).
func TestHintsFindWhatReferenceFinds(t *testing.T) {
	t.Parallel()
	names := []string{"Content-Type", "Date", "Content-Length", "X-Request-Id",
		"stripe-should-retry", "IDEMPOTENT-REPLAYED", "Idempotent-replayed"}
	names = append(names, retryHeaders[:]...)
	names = append(names, replayHeaders[:]...)
	for i := range 16 {
		names = append(names, "X-Other-"+strings.Repeat("a", i))
	}
	values := []string{"true", "TRUE", ` "true" `, "false", "False", `"false"`, "yes", "", "falſe", "tru", `"`, "true\t"}
	r := rand.New(rand.NewPCG(1, 2))
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
		resp := &http.Response{Header: h}
		if got, want := IsReplay(resp), refIsReplay(h); got != want {
			t.Fatalf("IsReplay(%q) = %v, the reference says %v", h, got, want)
		}
		gr, gok := retryHint(h)
		wr, wok := refRetryHint(h)
		if gr != wr || gok != wok {
			t.Fatalf("retryHint(%q) = %v, %v; the reference says %v, %v", h, gr, gok, wr, wok)
		}
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

// IsReplay and the retry hints look the header names up as they are
// written, without canonicalising them: each must be in canonical form, as
// net/http stores the headers it reads, or the lookup would miss.
func TestHintHeaderNamesAreCanonical(t *testing.T) {
	t.Parallel()
	for _, names := range [][]string{replayHeaders[:], retryHeaders[:]} {
		for _, name := range names {
			if c := http.CanonicalHeaderKey(name); c != name {
				t.Errorf("%q is not canonical (%q)", name, c)
			}
		}
	}
}

// The hints find what the reference finds in headers net/http's client
// builds from real wire answers over loopback: random header sections of
// 0 to 12 lines with the hints' names in several spellings (canonicalised
// by net/http or not), repeated lines, empty values, folded lines and
// padding names. Each header is read as it came and again padded with 9
// more names, and both agree with the reference.
//
// Found in review hv2 (7ce9851; was TestHV2WireHeadersScanMatchesLookups, then TestHintsWireHeadersScanMatchesLookups).
func TestHintsWireHeadersMatchReference(t *testing.T) {
	t.Parallel()
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
	refused := 0
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

		wantRetry, wantOK := refRetryHint(h)
		wantReplay := refIsReplay(h)
		padded := h.Clone()
		for j := range 9 {
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
}

// hW3's review of folded hint lines: quoted elements, empty ones, a
// "false" folded on one header's line and a "true" on another's, and the
// same header with 8 more names.

// Found in review hw3 (ca18fb8; was TestHW3FoldedHintsQuotedAndEmpty).
func TestHintsFoldedQuotedAndEmpty(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		h         http.Header
		retry, ok bool
	}{
		{http.Header{"Stripe-Should-Retry": {`"true", "false"`}}, false, true},
		{http.Header{"X-Should-Retry": {`, ,true,`}}, true, true},
		{http.Header{"X-Should-Retry": {`TRUE , "False"`}}, false, true},
		{http.Header{"X-Should-Retry": {`true`}, "Transient-Error": {`yes, false`}}, false, true},
		{http.Header{"X-Should-Retry": {`"true, false"`}}, false, false}, // one quoted string: neither
		{http.Header{"X-Should-Retry": {`,`, ``}}, false, false},
	} {
		for _, pad := range []int{0, 8} {
			h := c.h.Clone()
			for i := range pad {
				h.Set("X-Pad-"+strconv.Itoa(i), "1")
			}
			if retry, ok := retryHint(h); retry != c.retry || ok != c.ok {
				t.Errorf("%v (+%d): retryHint = %v, %v; want %v, %v", c.h, pad, retry, ok, c.retry, c.ok)
			}
		}
	}
	for _, c := range []struct {
		v    string
		want bool
	}{{`false, "true"`, true}, {`false,,`, false}, {`"false, true"`, false}, {` , TRUE`, true}} {
		if got := IsReplay(&http.Response{Header: http.Header{"Idempotent-Replayed": {c.v}}}); got != c.want {
			t.Errorf("IsReplay(%q) = %v", c.v, got)
		}
	}
}
