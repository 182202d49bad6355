package childtest_test

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/idemretry/idemretry/internal/childtest"
)

// TestStartChild is the child of TestStart: it says what it was given.
func TestStartChild(t *testing.T) {
	if !childtest.IsChild() {
		t.Skip("child process of TestStart")
	}
	_, _ = os.Stdout.WriteString("child " + os.Getenv("CHILDTEST_SAY") + "\n")
}

// A child runs the test it was started for, with IsChild true and the
// environment given; the parent is no child (were TestStart run in the
// child too, it would fail there, and so would Wait here).
func TestStart(t *testing.T) {
	if childtest.IsChild() {
		t.Fatal("the parent is a child")
	}
	cmd, out := childtest.Start(t, "TestStartChild", "CHILDTEST_SAY=hello")
	b, err := io.ReadAll(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	if !strings.Contains(string(b), "child hello\n") {
		t.Fatalf("child said %q", b)
	}
}
