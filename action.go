package idemretry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// MaxKeyLength is the longest Idempotency-Key accepted from a caller, in
// characters (Stripe's limit).
const MaxKeyLength = 255

type actionKey struct{}

// WithAction returns a copy of ctx that names the logical action its
// requests perform, such as "pay:order-A-1001". Every request sent with this
// action id carries the same Idempotency-Key for the whole key window: across
// retries, goroutines and, with a durable journal, restarts. Use one id per
// thing the user meant to do once, created when they first asked for it.
//
// Action ids are stored in the journal: they must not carry personal data.
func WithAction(ctx context.Context, actionID string) context.Context {
	return context.WithValue(ctx, actionKey{}, actionID)
}

// ActionFromContext returns the action id set by WithAction, if any.
func ActionFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(actionKey{}).(string)
	return id, ok && id != ""
}

// Prefixes of the action ids the Transport derives when the caller gave none.
const (
	keyActionPrefix         = "key:" // the caller set the header
	fingerprintActionPrefix = "fp:"  // derived from the request
)

// newUUIDKey returns a random UUIDv4 in its canonical form.
func newUUIDKey() (string, error) {
	u, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// parseKey accepts a caller-supplied key bare or in the IETF draft's quoted
// form and returns it bare.
func parseKey(v string) (string, error) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if v == "" || len(v) > MaxKeyLength {
		return "", fmt.Errorf("%w: length %d, want 1 to %d", ErrInvalidKey, len(v), MaxKeyLength)
	}
	for i := 0; i < len(v); i++ {
		// Visible ASCII only; '"' and '\' would need escaping in the quoted form.
		if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return "", fmt.Errorf("%w: character %q at %d", ErrInvalidKey, c, i)
		}
	}
	return v, nil
}

// formatKey renders a bare key for the header.
func formatKey(key string, quoted bool) string {
	if quoted {
		return `"` + key + `"`
	}
	return key
}

// fingerprint hashes what makes two requests the same payload: method, URL
// and body. body may be nil.
func fingerprint(req *http.Request, body io.Reader) (Fingerprint, error) {
	bh := sha256.New()
	if body != nil {
		if _, err := io.Copy(bh, body); err != nil {
			return Fingerprint{}, err
		}
	}
	h := sha256.New()
	io.WriteString(h, req.Method)
	h.Write([]byte{0})
	io.WriteString(h, req.URL.String())
	h.Write([]byte{0})
	h.Write(bh.Sum(nil))
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp, nil
}

func fingerprintActionID(fp Fingerprint) string {
	return fingerprintActionPrefix + hex.EncodeToString(fp[:])
}
