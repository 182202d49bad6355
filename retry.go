package idemretry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryPolicy decides whether an attempt's outcome is worth another attempt
// with the same key. resp is nil when err is not. ctx is the request's
// context. A policy must not close resp.Body nor consume it: to look at the
// body it may only replace resp.Body with one that yields the same bytes,
// as KeyReuseRejected does. Its reads of the body may take DefaultMaxDrainTime
// in all, after which the attempt is cut and they fail (a body that stalls
// must not hold the retries); the time the policy takes otherwise is its
// own, and never cuts the body of an answer it lets through. It must read
// the body only while it runs: a read it leaves blocked in a goroutine of
// its own keeps the attempt's clock running, and cuts the body it returns
// when that time is up. It must be safe for concurrent use. Replace DefaultRetryPolicy with WithRetryPolicy.
type RetryPolicy func(ctx context.Context, resp *http.Response, err error) bool

// DefaultRetryPolicy retries what can heal and nothing else. In order:
//
//   - never once ctx is done: the caller's own cancellation or deadline;
//   - transport errors (refused, reset, EOF, timeouts, HTTP/2 GOAWAY, ...)
//     are retried, except those that cannot heal: certificate verification
//     failures, and a TLS handshake with a server that does not speak TLS;
//   - an answer marked as a replay (see IsReplay) is final: the server
//     stored it and will only replay it again, whatever else it says;
//   - a retry hint overrides the status rule: Stripe-Should-Retry,
//     X-Should-Retry or Transient-Error set to "true" retries, "false" is
//     final. When they disagree, "false" wins, also between two lines of
//     one name;
//   - without a hint, 409, 429 and 5xx except 501 Not Implemented and 505
//     HTTP Version Not Supported are retried; every other status is final.
//     A 409 is the IETF draft's "a request with this key is still being
//     processed": the resend waits for it;
//   - an answer that would be retried is final after all if the server
//     says the key was used before with another payload (see
//     KeyReuseRejected): that cannot heal, whatever a hint says. To tell,
//     the policy may read the first 8 KiB of a JSON body of a 400, 409 or
//     422, and leaves resp.Body yielding the whole body.
func DefaultRetryPolicy(ctx context.Context, resp *http.Response, err error) bool {
	if ctx != nil && ctx.Err() != nil {
		return false
	}
	if err != nil {
		return retryableError(err)
	}
	if resp == nil || IsReplay(resp) {
		return false
	}
	retry, hinted := retryHint(resp.Header)
	if !hinted {
		retry = retryableStatus(resp.StatusCode)
	}
	return retry && !KeyReuseRejected(resp)
}

// retryableStatus reports whether DefaultRetryPolicy retries a response with
// this status and no hint: 409, 429 and 5xx except 501 and 505.
func retryableStatus(code int) bool {
	switch {
	case code == http.StatusConflict, code == http.StatusTooManyRequests:
		return true
	case code == http.StatusNotImplemented, code == http.StatusHTTPVersionNotSupported:
		return false
	case code >= 500 && code <= 599:
		return true
	}
	return false
}

// retryableError reports whether a transport error may heal on its own.
// Everything that reaches the network and fails is presumed to heal (a key
// makes the resend safe); the exceptions are failures a resend repeats.
func retryableError(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalidCert      x509.CertificateInvalidError
		verification     *tls.CertificateVerificationError
		recordHeader     tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, context.Canceled),
		errors.As(err, &unknownAuthority),
		errors.As(err, &hostname),
		errors.As(err, &invalidCert),
		errors.As(err, &verification),
		errors.As(err, &recordHeader):
		return false
	}
	return true
}

// RetryAfter returns the wait an error response (status 400 to 599) asks
// for with its Retry-After header, in delta-seconds or as an HTTP-date
// relative to now, and whether it asked. A date in the past asks for no
// wait; a malformed or negative value, or a status below 400, asks for
// nothing (on a redirect, Retry-After is the wait before following it).
// The Transport reads it on every answer it retries, whatever its status: a
// 429 or 503, NestJS's 409 for a key still being processed, a 502 from a
// gateway, a 400 a retry hint makes retryable.
func RetryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil || resp.StatusCode < 400 || resp.StatusCode > 599 {
		return 0, false
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		return retryAfterSeconds(v)
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	if d < 0 {
		d = 0
	}
	return d, true
}

// retryAfterSeconds parses delta-seconds: digits only, RFC 9110 10.2.3.
func retryAfterSeconds(v string) (time.Duration, bool) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs > int64(maxDuration/time.Second) {
		return maxDuration, true // more digits than fit: "a very long time"
	}
	return time.Duration(secs) * time.Second, true
}

const maxDuration = time.Duration(1<<63 - 1)
