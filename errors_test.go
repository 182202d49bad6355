package idemretry_test

// What the errors of RoundTrip say: an ActionError's message tells this
// request's attempts from the action's earlier ones.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

// Issue 30, item 5: a request refused before anything of it was sent read
// "1 attempt, last status 201", as if it had been sent once.
func TestActionErrorSaysNothingSentForARefusal(t *testing.T) {
	t.Parallel()
	srv := newPayServer(t)
	tr := transportOver(t, journal.NewMemory())
	ctx := idemretry.WithAction(context.Background(), "pay:1")
	roundTrip(t, tr, post(t, ctx, srv.URL, `{"amount":1}`))

	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":2}`))
	require.ErrorIs(t, err, idemretry.ErrFingerprintMismatch)
	var ae *idemretry.ActionError
	require.True(t, errors.As(err, &ae))
	assert.Equal(t, 1, ae.Attempts, "Attempts counts the action's")
	assert.Equal(t, `idemretry: action "pay:1" (key `+ae.Key+`): nothing sent (the action had 1 attempt, last status 201): action reused with a different request`, err.Error())
	assert.Len(t, srv.seen(), 1)
}

// A resend of a pending action counts its own attempts apart from the
// earlier ones.
func TestActionErrorSaysWhichAttemptsAreEarlier(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { hijackAndClose(w) })
	tr := transportOver(t, journal.NewMemory(), idemretry.WithMaxRetries(0))
	ctx := idemretry.WithAction(context.Background(), "pay:1")
	_, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	var ae *idemretry.ActionError
	require.True(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, `idemretry: action "pay:1" (key `+ae.Key+`): 1 attempt: attempts exhausted: `+ae.Err.Error(), err.Error())

	_, err = tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
	require.True(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, 2, ae.Attempts)
	assert.Equal(t, `idemretry: action "pay:1" (key `+ae.Key+`): 1 attempt (2 with earlier ones): attempts exhausted: `+ae.Err.Error(), err.Error())
}

func TestActionErrorMessage(t *testing.T) {
	t.Parallel()
	keyed := &idemretry.ActionError{Action: "pay:1", Key: "k", Attempts: 6, Status: 503, Reason: idemretry.ErrAttemptsExhausted}
	assert.Equal(t, `idemretry: action "pay:1" (key k): 6 attempts, last status 503: attempts exhausted`, keyed.Error())
	unkeyed := &idemretry.ActionError{Attempts: 1, Err: errors.New("boom")}
	assert.Equal(t, "idemretry: 1 attempt: boom", unkeyed.Error())
}

// The sentinels' messages say what happened in a few words, with the
// package prefix once; their causes are in their doc comments (issue 27:
// ErrFingerprintUncheckable's was a paragraph of 258 characters).
func TestSentinelMessagesAreShort(t *testing.T) {
	t.Parallel()
	for _, err := range []error{idemretry.ErrKeyWindowExpired, idemretry.ErrOutcomeUnknown, idemretry.ErrFingerprintMismatch,
		idemretry.ErrFingerprintUncheckable, idemretry.ErrInvalidKey, idemretry.ErrBodyTooLarge, idemretry.ErrClockSkew,
		idemretry.ErrAttemptsExhausted, idemretry.ErrWaitExceedsDeadline, idemretry.ErrInvalidAction, idemretry.ErrInvalidRequest,
		idemretry.ErrParked, idemretry.ErrRetryAfterTooLong, idemretry.ErrActionRequired, idemretry.ErrResponseNotShared,
		idemretry.ErrNotResumable, idemretry.ErrInvalidOption, idemretry.ErrKeyReused, idemretry.ErrLeaseHeld, idemretry.ErrLeaseLost,
		journal.ErrClosed, journal.ErrNotFound, journal.ErrUnavailable, journal.ErrInvalidRecord, journal.ErrCorruptRecord,
		journal.ErrIncompatible} {
		msg := err.Error()
		if !strings.HasPrefix(msg, "idemretry: ") || strings.Count(msg, "idemretry") != 1 {
			t.Errorf("%q: want the prefix \"idemretry: \" once", msg)
		}
		if len(msg) > 70 || strings.ContainsAny(strings.TrimPrefix(msg, "idemretry: "), ":;()") {
			t.Errorf("%q (%d characters): want one short clause", msg, len(msg))
		}
	}
}
