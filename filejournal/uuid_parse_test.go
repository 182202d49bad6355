package filejournal

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// parseUUID by fixed places agrees with a byte-by-byte reading of the
// canonical form on canonical keys and on every kind of near miss: a byte
// replaced by any byte, a dash moved, upper case, a length off by one. It
// takes exactly what formatUUID writes, and leaves nothing behind in out
// when it refuses.
func TestParseUUIDAgreesWithAPlainReading(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	check := func(s string) {
		t.Helper()
		var got, want [16]byte
		got = [16]byte{1, 2, 3}
		ok := parseUUID(s, &got)
		wantOK := plainParseUUID(s, &want)
		require.Equal(t, wantOK, ok, "%q", s)
		if !ok {
			require.Equal(t, [16]byte{}, got, "%q refused but out written", s)
			return
		}
		require.Equal(t, want, got, "%q", s)
		require.Equal(t, s, formatUUID(&got))
	}
	for range 2000 {
		var k [16]byte
		for i := range k {
			k[i] = byte(r.IntN(256))
		}
		s := formatUUID(&k)
		check(s)
		b := []byte(s)
		b[r.IntN(len(b))] = byte(r.IntN(256))
		check(string(b))
		i := r.IntN(len(s))
		check(s[:i] + s[i+1:] + "0")
		check(s + "0")
		check(s[:len(s)-1])
		up := []byte(s)
		for i := range up {
			if up[i] >= 'a' && up[i] <= 'f' {
				up[i] -= 'a' - 'A'
			}
		}
		check(string(up))
	}
	check("")
	check("--------------------------------------")
}

// plainParseUUID is the canonical form read byte by byte, the reference.
func plainParseUUID(s string, out *[16]byte) bool {
	if len(s) != 36 {
		return false
	}
	j := 0
	for i := 0; i < 36; i++ {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if s[i] != '-' {
				return false
			}
			continue
		}
		d := s[i]
		var v byte
		switch {
		case d >= '0' && d <= '9':
			v = d - '0'
		case d >= 'a' && d <= 'f':
			v = d - 'a' + 10
		default:
			return false
		}
		if j%2 == 0 {
			out[j/2] = v << 4
		} else {
			out[j/2] |= v
		}
		j++
	}
	return true
}
