package sqljournal

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/idemretry/idemretry/journal"
)

// Errors of this package, returned wrapped; test them with errors.Is. The
// Journal also wraps the sentinels of package journal (see [Journal]).
var (
	// ErrInvalidOption: [Open] was given a nil *sql.DB or a bad option
	// value (a table name outside [WithTable]'s rule, a key window that is
	// not positive, a negative grace, a nil clock). Nothing is clamped or
	// replaced by a default: the error says which value is wrong.
	ErrInvalidOption = errors.New("idemretry: invalid sqljournal option")
	// ErrMalformedRecord: a row holds values no Journal writes (a NULL in
	// a table made without Open's NOT NULL, a fingerprint that is not 32
	// bytes, a state other than the three, a
	// record that journal.CheckRecord refuses: an empty key, attempts out of
	// range, ...). It was written by something else and is left as it is
	// for a person to see; errors.Is matches journal.ErrCorruptRecord too.
	// Records a caller passes in are refused with journal.ErrInvalidRecord
	// instead.
	ErrMalformedRecord error = malformedRecord{}
	// ErrContended: Reserve found the action's record changing under it
	// (forgotten, or finished and replaced) on every one of its tries, or
	// Lease found the action's lease changing hands on every one of its.
	ErrContended = errors.New("idemretry: action record changed concurrently on every try")
)

// malformedRecord is ErrMalformedRecord, a journal.ErrCorruptRecord.
type malformedRecord struct{}

func (malformedRecord) Error() string        { return "idemretry: malformed record in the journal's table" }
func (malformedRecord) Is(target error) bool { return target == journal.ErrCorruptRecord }

// malformedRow is the ErrMalformedRecord of one row: the row's action id
// (as stored: the digest form, with WithHashedIDs), and what is wrong.
type malformedRow struct {
	id, why string
}

// malformed returns the ErrMalformedRecord of the row of id, which says
// what is wrong (format and args).
func malformed(id, format string, args ...any) error {
	return &malformedRow{id: id, why: fmt.Sprintf(format, args...)}
}

func (e *malformedRow) Error() string {
	return fmt.Sprintf("action %q: %s: %v", e.id, e.why, ErrMalformedRecord)
}

func (e *malformedRow) Unwrap() error { return ErrMalformedRecord }

// dbError wraps err, from the statements of op, for the caller. When the
// database did not answer (see unavailable) it also wraps
// journal.ErrUnavailable; when ctx ended during the call, its
// error is in the chain too. err itself, the driver's, is always kept.
func dbError(ctx context.Context, op string, err error) error {
	if errors.Is(err, ErrMalformedRecord) || errors.Is(err, ErrContended) {
		return fmt.Errorf("sqljournal: %s: %w", op, err)
	}
	cerr := ctx.Err()
	switch {
	case unavailable(ctx, err) && cerr != nil && !errors.Is(err, cerr):
		return fmt.Errorf("sqljournal: %s: %w: %w: %w", op, journal.ErrUnavailable, cerr, err)
	case unavailable(ctx, err):
		return fmt.Errorf("sqljournal: %s: %w: %w", op, journal.ErrUnavailable, err)
	case cerr != nil && !errors.Is(err, cerr):
		return fmt.Errorf("sqljournal: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("sqljournal: %s: %w", op, err)
}

// unavailable reports whether err, from a statement run under ctx, means
// that the database did not answer: it ran out of ctx's deadline (a
// database too slow, paused or cut off), the connection failed (refused,
// reset, closed, timed out, killed), or the server says it cannot serve
// (see unavailableState). A caller's own cancellation is not the
// database's fault, and is reported as context.Canceled only.
func unavailable(ctx context.Context, err error) bool {
	if err == nil {
		return false
	}
	if cerr := ctx.Err(); cerr != nil {
		return errors.Is(cerr, context.DeadlineExceeded)
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true // a deadline of the driver's own (a connect timeout)
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ETIMEDOUT) {
		return true
	}
	var st interface{ SQLState() string }
	return errors.As(err, &st) && unavailableState(st.SQLState())
}

// unavailableState reports whether a PostgreSQL error code (SQLSTATE) says
// that the server cannot serve the journal now, rather than that the
// statement is wrong: class 08 (connection exception), class 53
// (insufficient resources: disk full, out of memory, too many
// connections), class 58 (system error: I/O), a server shutting down,
// starting up or ending the session (57P01, 57P02, 57P03, 57P05), a
// statement cancelled by a timeout (57014) or a lock wait timed out
// (55P03), and a read-only server (25006: a standby, as after a failover).
// The codes are read through the SQLState method that the pgx and lib/pq
// errors both have.
func unavailableState(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "58"):
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", "57P05", "57014", "55P03", "25006":
		return true
	}
	return false
}
