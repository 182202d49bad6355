package idemretry

import (
	"crypto/rand"
	"net/url"
	"testing"

	"github.com/google/uuid"
)

// formatUUID must write exactly what uuid.UUID.String writes: keys minted
// before and after it are compared as strings by journals and servers.
func TestFormatUUIDIsUUIDString(t *testing.T) {
	cases := []uuid.UUID{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}}
	for range 10000 {
		var u uuid.UUID
		rand.Read(u[:])
		cases = append(cases, u)
	}
	for _, u := range cases {
		if got, want := formatUUID(&u), u.String(); got != want {
			t.Fatalf("formatUUID(%x) = %q, want %q", u[:], got, want)
		}
	}
}

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
