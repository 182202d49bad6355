// Package childtest runs a test binary's own tests as child processes, for
// tests that kill a process in the middle of its work (SIGKILL, or a
// failpoint that exits) and check what it left behind.
//
// A child is the test binary run again with -test.run=^name$, and an
// environment in which IsChild reports true. The child test (a TestXChild
// function, or a test that is its own child) does its work when IsChild is
// true, and skips otherwise:
//
//	func TestKillChild(t *testing.T) {
//		if !childtest.IsChild() {
//			t.Skip("child process of TestKill")
//		}
//		...
//	}
//
//	func TestKill(t *testing.T) {
//		cmd, out := childtest.Start(t, "TestKillChild", "DIR="+dir)
//		...
//	}
package childtest

import (
	"io"
	"os"
	"os/exec"
	"testing"
)

// envChild names, in a child's environment, the test it runs.
const envChild = "IDEMRETRY_CHILD_TEST"

// IsChild reports whether this process is a child that Start or Command
// started.
func IsChild() bool { return os.Getenv(envChild) != "" }

// Command returns, not started, the command that runs the test binary again
// running only the test named name, with env added to this process's
// environment. Callers may change it before they start it: its Path (a
// copy of the binary, elsewhere), its SysProcAttr (another user).
func Command(name string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	// A race-enabled child would sleep a second at exit by default.
	cmd.Env = append(os.Environ(), append([]string{envChild + "=" + name, "GORACE=atexit_sleep_ms=0"}, env...)...)
	return cmd
}

// Start starts Command(name, env...) with its stdout piped to the reader it
// returns and its stderr to this process's. The child is killed when t
// ends, whatever fails: one that loops until it is killed would hold what
// the test run holds (a lock file's descriptor, say) for ever. Killing one
// already reaped is harmless.
func Start(t testing.TB, name string, env ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := Command(name, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("childtest: %v", err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("childtest: start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, out
}
