package otelidemretry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
)

// errorType is error.type for an error that ended an attempt or a
// RoundTrip, as the package documentation lists (Errors), by the semantic
// conventions' rule
// (https://opentelemetry.io/docs/specs/semconv/registry/attributes/error/):
// predictable and of low cardinality, the full name of the error's type or
// an identifier the instrumentation documents, looking through wrappers
// that classify nothing (the rule allows Go's %w to be unwrapped).
func errorType(err error) attribute.KeyValue {
	if name := errorTypeName(err, 0); name != "" {
		return semconv.ErrorTypeKey.String(name)
	}
	return semconv.ErrorTypeOther
}

// maxErrorDepth bounds how deep errorTypeName looks into an error's causes.
const maxErrorDepth = 32

// errorTypeName is errorType's name for err, or "" for none.
func errorTypeName(err error, depth int) string {
	if err == nil || depth > maxErrorDepth {
		return ""
	}
	if et, ok := err.(interface{ ErrorType() string }); ok && et.ErrorType() != "" {
		return et.ErrorType()
	}
	if te, ok := err.(interface{ Timeout() bool }); err == context.DeadlineExceeded || ok && te.Timeout() {
		return "timeout"
	}
	t := reflect.TypeOf(err)
	if t.Comparable() { // a map lookup of an uncomparable value panics
		if name, ok := wellKnown[err]; ok {
			return name
		}
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if wraps(t) {
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			return errorTypeName(u.Unwrap(), depth+1)
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if name := errorTypeName(e, depth+1); name != "" {
					return name
				}
			}
		}
		return ""
	}
	if t == errorString || t.PkgPath() == "" || t.Name() == "" {
		return ""
	}
	return t.PkgPath() + "." + t.Name()
}

// wraps reports whether errors of type t (a pointer's element type) only
// wrap others: *url.Error, which http.Client puts around every error, or
// an unexported type that unwraps (fmt's, errors.Join's, idemretry's
// message prefixes).
func wraps(t reflect.Type) bool {
	if t == urlError {
		return true
	}
	name := t.Name()
	if name == "" || t.PkgPath() == "" || name[0] >= 'A' && name[0] <= 'Z' {
		return false
	}
	p := reflect.PointerTo(t)
	return t.Implements(unwrapOne) || p.Implements(unwrapOne) || t.Implements(unwrapMany) || p.Implements(unwrapMany)
}

var (
	errorString = reflect.TypeOf(errors.New("")).Elem()
	urlError    = reflect.TypeOf(url.Error{})
	unwrapOne   = reflect.TypeOf((*interface{ Unwrap() error })(nil)).Elem()
	unwrapMany  = reflect.TypeOf((*interface{ Unwrap() []error })(nil)).Elem()
)

// wellKnown names the error values that error.type reports by their
// names: an attempt's common ends, and idemretry's and journal's exported
// errors, each its package path and name.
var wellKnown = func() map[error]string {
	m := map[error]string{
		io.EOF:                     "io.EOF",
		io.ErrUnexpectedEOF:        "io.ErrUnexpectedEOF",
		context.Canceled:           "context.Canceled",
		net.ErrClosed:              "net.ErrClosed",
		http.ErrSchemeMismatch:     "net/http.ErrSchemeMismatch",
		http.ErrBodyReadAfterClose: "net/http.ErrBodyReadAfterClose",
	}
	root := reflect.TypeOf(idemretry.ActionError{}).PkgPath() + "."
	for err, name := range map[error]string{
		idemretry.ErrKeyWindowExpired: "ErrKeyWindowExpired", idemretry.ErrOutcomeUnknown: "ErrOutcomeUnknown",
		idemretry.ErrFingerprintMismatch: "ErrFingerprintMismatch", idemretry.ErrFingerprintUncheckable: "ErrFingerprintUncheckable",
		idemretry.ErrInvalidKey: "ErrInvalidKey", idemretry.ErrBodyTooLarge: "ErrBodyTooLarge",
		idemretry.ErrClockSkew: "ErrClockSkew", idemretry.ErrAttemptsExhausted: "ErrAttemptsExhausted",
		idemretry.ErrWaitExceedsDeadline: "ErrWaitExceedsDeadline", idemretry.ErrInvalidAction: "ErrInvalidAction",
		idemretry.ErrInvalidRequest: "ErrInvalidRequest", idemretry.ErrParked: "ErrParked",
		idemretry.ErrRetryAfterTooLong: "ErrRetryAfterTooLong", idemretry.ErrActionRequired: "ErrActionRequired",
		idemretry.ErrResponseNotShared: "ErrResponseNotShared", idemretry.ErrNotResumable: "ErrNotResumable",
		idemretry.ErrInvalidOption: "ErrInvalidOption", idemretry.ErrKeyReused: "ErrKeyReused",
		idemretry.ErrLeaseHeld: "ErrLeaseHeld", idemretry.ErrLeaseLost: "ErrLeaseLost",
	} {
		m[err] = root + name
	}
	jpkg := reflect.TypeOf(journal.Record{}).PkgPath() + "."
	for err, name := range map[error]string{
		journal.ErrClosed: "ErrClosed", journal.ErrNotFound: "ErrNotFound", journal.ErrUnavailable: "ErrUnavailable",
		journal.ErrInvalidRecord: "ErrInvalidRecord", journal.ErrIncompatible: "ErrIncompatible",
	} {
		m[err] = jpkg + name
	}
	return m
}()
