package httptoken

import "testing"

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"Idempotency-Key": true, "X-Request-Id": true, "POST": true, "!#$%&'*+-.^_`|~09azAZ": true,
		"": false, "Idempotency Key": false, "Key:": false, "a\tb": false, "a\x7fb": false,
		"é": false, `"quoted"`: false, "a/b": false, "{x}": false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}
