package idemretry

import (
	"errors"
	"strings"
	"testing"
)

// A journal's own error already says what failed ("idemretry: journal
// close: ..."): the failure's message says it once, not "journal close:
// journal close: ...", and keeps the cause for errors.Is.
func TestJournalFailureSaysTheOperationOnce(t *testing.T) {
	cause := errors.New("no space left on device")
	for _, c := range []struct {
		err  error
		what string
		want string
	}{
		{joinErr("idemretry: journal close: fingerprint.key deleted and not made again", cause), "close",
			"idemretry: journal close: fingerprint.key deleted and not made again: no space left on device"},
		{joinErr("idemretry: journal sync", cause), "sync", "idemretry: journal sync: no space left on device"},
		{cause, "forget \"pay:1\"", "idemretry: journal forget \"pay:1\": no space left on device"},
	} {
		f := journalFailure(c.err, c.what)
		if got := f.f.Message; got != c.want {
			t.Errorf("message %q, want %q", got, c.want)
		}
		if strings.Count(f.f.Message, "journal "+c.what) != 1 {
			t.Errorf("%q says %q more than once", f.f.Message, "journal "+c.what)
		}
		if !errors.Is(f.cause, cause) {
			t.Errorf("the cause is lost: %v", f.cause)
		}
	}
}

// joinErr is msg wrapping cause, as the journals' errors are.
func joinErr(msg string, cause error) error { return &wrapped{msg, cause} }

type wrapped struct {
	msg   string
	cause error
}

func (w *wrapped) Error() string { return w.msg + ": " + w.cause.Error() }
func (w *wrapped) Unwrap() error { return w.cause }
