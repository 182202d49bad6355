package filejournal

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// closeFailingFile fails its Close with errClose, after closing the file.
type closeFailingFile struct{ file }

var errClose = errors.New("injected EIO")

func (f closeFailingFile) Close() error {
	_ = f.file.Close()
	return errClose
}

// A journal file that fails to close: Close says so once, with the package
// prefix once and "close" once, and the cause stays reachable.
func TestCloseErrorSaysCloseOnce(t *testing.T) {
	o := testOpts()
	o.hooks = &hooks{wrapFile: func(name string, f file) file {
		if name == journalName {
			return closeFailingFile{f}
		}
		return f
	}}
	s, _ := mustOpen(t, t.TempDir(), o)
	reserve(t, s, entry("a"))
	err := s.Close()
	require.ErrorIs(t, err, errClose)
	require.EqualError(t, err, "idemretry: journal close: injected EIO")
}
