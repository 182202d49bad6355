package filejournal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// DefaultDir returns the directory where idemretry's NewClient and
// NewTransport keep their journal unless told otherwise
// (idemretry.WithJournalDir):
//
//   - Linux and other Unix: $XDG_STATE_HOME/idemretry/<program>, or
//     ~/.local/state/idemretry/<program>;
//   - darwin: ~/Library/Application Support/idemretry/<program>;
//   - Windows: %LocalAppData%\idemretry\<program>;
//
// where <program> is the executable's base name without its extension. Two
// programs thus never share a journal, and two instances of one program
// exclude each other (ErrLocked). On Android and iOS there is no usable
// default: apps pass their private files directory to
// idemretry.WithJournalDir, and DefaultDir returns an error.
func DefaultDir() (string, error) {
	base, err := stateBase()
	if err != nil {
		return "", fmt.Errorf("idemretry: default journal directory: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("idemretry: default journal directory: %w", err)
	}
	name := filepath.Base(exe)
	name = strings.TrimSuffix(name, filepath.Ext(name))
	if name == "" || name == "." {
		return "", errors.New("idemretry: default journal directory: no program name")
	}
	return filepath.Join(base, "idemretry", name), nil
}

func stateBase() (string, error) {
	switch runtime.GOOS {
	case "android", "ios":
		return "", fmt.Errorf("none on %s: pass the app's files directory to WithJournalDir", runtime.GOOS)
	case "windows":
		return os.UserCacheDir() // %LocalAppData%
	case "darwin":
		return os.UserConfigDir() // ~/Library/Application Support
	case "plan9", "js", "wasip1":
		return os.UserConfigDir()
	}
	// The XDG spec says to ignore a relative path.
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".local", "state"), nil
}
