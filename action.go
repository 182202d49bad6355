package idemretry

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/idemretry/idemretry/journal"
)

type actionKey struct{}

// WithAction returns a copy of ctx that names the logical action its
// requests perform, such as "pay:order-A-1001". Every request sent with this
// action id carries the same Idempotency-Key for the whole key window: across
// retries, goroutines and, with a durable journal, restarts. Use one id per
// thing the user meant to do once, created when they first asked for it.
//
// Action ids are stored in the journal: they must not carry personal data.
// An empty id, or one starting with "key:" or "fp:" (the forms of the ids the
// Transport derives itself), makes RoundTrip fail with ErrInvalidAction.
//
// The id, not a key on the request, names the action: an SDK's key (stripe-go
// sets a new one on every call) lives as long as one call, the id as long as
// the app keeps it. A key the request carries (an SDK's, or the caller's
// own) becomes the action's key only if the action is new: it is adopted,
// and sent as written (bare or quoted), on that first request. Every later
// request of the action carries the journaled key, in that form, in its
// place, after a restart too, whatever valid key it carries (logged at
// Debug); one that carries two keys, or one that is not a key, is refused
// as the action's (ErrInvalidKey, with the journaled key), nothing sent.
// So a new payment needs a new id. One key under two ids is two actions
// here and one key to the server, which judges the second (Stripe refuses
// another payload: ErrKeyReused): give each action its own key, or none.
//
// A nil ctx gives a nil context, which http.NewRequestWithContext refuses
// with an error (context.WithValue would panic).
func WithAction(ctx context.Context, actionID string) context.Context {
	if ctx == nil {
		return nil
	}
	return context.WithValue(ctx, actionKey{}, actionID)
}

// actionOf returns the id WithAction set on ctx, if any.
func actionOf(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(actionKey{}).(string)
	return id, ok
}

// ActionFromContext returns the action id set by WithAction, if any.
func ActionFromContext(ctx context.Context) (string, bool) {
	id, ok := actionOf(ctx)
	return id, ok && id != ""
}

// Parts of the action ids the Transport derives. Ids given to WithAction
// may not start with a derived id's prefix, so the two never collide.
const (
	keyActionPrefix         = "key:"       // the caller set the header
	fingerprintActionPrefix = "fp:"        // derived from the request
	redirectActionInfix     = " redirect:" // a 307/308 hop, + 8 bytes of its fingerprint in hex
)

// checkActionID refuses ids that WithAction must not be given.
func checkActionID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty action id", ErrInvalidAction)
	case len(id) > journal.MaxActionID-len(redirectActionInfix)-16:
		return fmt.Errorf("%w: %d bytes, want at most %d", ErrInvalidAction, len(id), journal.MaxActionID-len(redirectActionInfix)-16)
	case strings.HasPrefix(id, keyActionPrefix), strings.HasPrefix(id, fingerprintActionPrefix):
		return fmt.Errorf("%w: %q: the prefixes %q and %q are reserved", ErrInvalidAction, id, keyActionPrefix, fingerprintActionPrefix)
	}
	return nil
}

// newUUIDKey returns a random UUIDv4 in its canonical form, its bytes
// read from crypto/rand.Reader when it is called (uuid.SetRand does not
// apply to it; WithKeyGenerator replaces it). crypto/rand's own Reader
// returns no error: since Go 1.24 it ends the process if the system's
// random source fails. A Reader the program set in its place is read
// until it gives all 16 bytes, and its error returned.
func newUUIDKey() (string, error) {
	u, err := uuid.NewRandomFromReader(rand.Reader)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// parseKey accepts a caller-supplied key bare or in the IETF draft's quoted
// form and returns it bare.
func parseKey(v string) (string, error) {
	k, _, err := parseKeyForm(v)
	return k, err
}

// parseKeyForm is parseKey that also returns the form v wrote the key in:
// journal.KeyFormQuoted for "K", else journal.KeyFormBare. Spaces around v
// (a header's optional whitespace) are no part of either.
func parseKeyForm(v string) (string, journal.KeyForm, error) {
	v = strings.TrimSpace(v)
	form := journal.KeyFormBare
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v, form = v[1:len(v)-1], journal.KeyFormQuoted
	}
	if v == "" || len(v) > journal.MaxKeyLength { // what every journal stores
		return "", 0, fmt.Errorf("%w: length %d, want 1 to %d", ErrInvalidKey, len(v), journal.MaxKeyLength)
	}
	for i := 0; i < len(v); i++ {
		// Visible ASCII only; '"' and '\' would need escaping in the quoted form.
		if c := v[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return "", 0, fmt.Errorf("%w: character %q at %d", ErrInvalidKey, c, i)
		}
	}
	return v, form, nil
}

// headerValues returns every value of header name in h, under its
// canonical form or any other spelling (a caller may set
// h["idempotency-key"] directly, and net/http would send it as is).
func headerValues(h http.Header, name string) []string {
	vs := h[name]
	for k, v := range h {
		if k != name && strings.EqualFold(k, name) {
			vs = append(vs[:len(vs):len(vs)], v...)
		}
	}
	return vs
}

// formatKey renders a bare key for the header, quoted or bare (see
// Transport.quotedForm).
func formatKey(key string, quoted bool) string {
	if quoted {
		return `"` + key + `"`
	}
	return key
}
