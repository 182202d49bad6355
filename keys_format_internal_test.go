package idemretry

import (
	"net/url"
	"testing"
)

// The URL in a fingerprint is URL.String's, whichever way appendURL takes:
// every byte value in a host and a path, one at a time.
func TestAppendURLIsURLStringForEveryByte(t *testing.T) {
	for c := 0; c < 256; c++ {
		for _, u := range []*url.URL{
			{Scheme: "https", Host: "pay.example" + string(rune(c)) + ":8443", Path: "/v1/charges"},
			{Scheme: "https", Host: "pay.example", Path: "/v1/" + string([]byte{byte(c)}) + "/charges", RawQuery: "a=b"},
			{Scheme: "http", Host: "[::1]:80", Path: "/x" + string([]byte{byte(c)})},
		} {
			if got, want := string(appendURL(nil, u)), u.String(); got != want {
				t.Fatalf("byte %#x: appendURL = %q, URL.String = %q", c, got, want)
			}
		}
	}
}
