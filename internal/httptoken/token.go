// Package httptoken holds the HTTP token rule (RFC 9110, 5.6.2) that the
// module's packages check header names and methods against.
package httptoken

import "strings"

// Valid reports whether s is a non-empty HTTP token, as a header name or a
// method must be.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
