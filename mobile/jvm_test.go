//go:build linux

package idemretry_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJVMPaymentSurvivesKill runs the Java bindings on a desktop JVM, the
// way an Android app runs them: gobind generates the Java classes and the
// JNI half in Go and C, the Go side is built as a shared library
// (libgojni.so, cgo, against the JDK's jni.h and a stand-in for Android's
// log header), and testdata/jvm/PayKill.java pays against a loopback
// server, is killed with SIGKILL after the server committed the payment
// and before the answer, restarts on the same journal directory, resumes
// through a Rebuilder written in Java, and is answered with the replay of
// the one charge. It also checks that error kinds and constants cross the
// boundary.
//
// It needs javac, java (with the JDK's include/jni.h) and a C compiler;
// without them it is skipped, or fails when CI is set.
func TestJVMPaymentSurvivesKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the bindings (about a minute)")
	}
	jdk, cc := jvmTools(t)
	modDir, err := os.Getwd()
	require.NoError(t, err)
	work := t.TempDir()
	gen := filepath.Join(work, "gen")

	// The bindings, as gomobile bind makes them for Android.
	goEnv := append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	runIn(t, modDir, goEnv, "go", "tool", "gobind", "-lang=go,java", "-outdir", gen, "github.com/idemretry/idemretry/mobile")

	// The Go half as a desktop JNI library: gobind's files for Android,
	// renamed so that they build on linux, in a module of their own.
	src := filepath.Join(work, "gosrc")
	require.NoError(t, os.MkdirAll(src, 0o755))
	entries, err := os.ReadDir(filepath.Join(gen, "src", "gobind"))
	require.NoError(t, err)
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.Contains(name, "_darwin"), strings.HasSuffix(name, ".m"), strings.HasSuffix(name, ".objc.h"):
			continue
		case strings.HasSuffix(name, "_android.go"):
			name = strings.TrimSuffix(name, "_android.go") + "_jni.go"
		case strings.HasSuffix(name, "_android.c"):
			name = strings.TrimSuffix(name, "_android.c") + "_jni.c"
		}
		b, err := os.ReadFile(filepath.Join(gen, "src", "gobind", e.Name()))
		require.NoError(t, err)
		// No Android log library here (testdata/jvm/shim/android/log.h
		// writes to stderr).
		b = []byte(strings.ReplaceAll(string(b), "//#cgo LDFLAGS: -llog\n", ""))
		require.NoError(t, os.WriteFile(filepath.Join(src, name), b, 0o644))
	}
	mobileVersion := strings.TrimSpace(runIn(t, modDir, goEnv, "go", "list", "-m", "-f", "{{.Version}}", "golang.org/x/mobile"))
	goMod := "module idemretry.test/jni\n\ngo 1.26.0\n\nrequire (\n" +
		"\tgithub.com/idemretry/idemretry/mobile v0.0.0\n" +
		"\tgolang.org/x/mobile " + mobileVersion + "\n)\n\n" +
		"replace github.com/idemretry/idemretry/mobile => " + modDir + "\n\n" +
		"replace github.com/idemretry/idemretry => " + filepath.Dir(modDir) + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(src, "go.mod"), []byte(goMod), 0o644))
	sum, err := os.ReadFile(filepath.Join(modDir, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(src, "go.sum"), sum, 0o644))
	shim := filepath.Join(modDir, "testdata", "jvm", "shim")
	lib := filepath.Join(work, "lib")
	buildEnv := append(goEnv, "CGO_ENABLED=1", "CC="+cc,
		"CGO_CFLAGS=-I"+filepath.Join(jdk, "include")+" -I"+filepath.Join(jdk, "include", "linux")+
			" -I"+shim+" -D__GOBIND_ANDROID__ -Wno-incompatible-pointer-types")
	runIn(t, src, buildEnv, "go", "build", "-mod=mod", "-buildmode=c-shared", "-o", filepath.Join(lib, "libgojni.so"), ".")

	// The Java half and the app.
	classes := filepath.Join(work, "classes")
	javaFiles := []string{filepath.Join(shim, "java", "android", "content", "Context.java"), filepath.Join(modDir, "testdata", "jvm", "PayKill.java")}
	for _, dir := range []string{"go", "idemretry"} {
		fs, err := filepath.Glob(filepath.Join(gen, "java", dir, "*.java"))
		require.NoError(t, err)
		javaFiles = append(javaFiles, fs...)
	}
	runIn(t, work, nil, filepath.Join(jdk, "bin", "javac"), append([]string{"-nowarn", "-d", classes}, javaFiles...)...)

	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	dir := filepath.Join(work, "files", "idemretry")
	app := func(mode string) (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.Command(filepath.Join(jdk, "bin", "java"), "-Djava.library.path="+lib, "-cp", classes, "PayKill", mode, dir, srv.URL)
		return startApp(t, cmd)
	}

	cmd, _ := app("pay")
	key := killAfterCommit(t, srv, cmd)

	cmd, out := app("resume")
	got := lines(out)
	require.NoError(t, cmd.Wait(), "%q", got)
	assert.Equal(t, []string{
		"unfinished pay:order-jvm-1 " + key,
		`resumed pay:order-jvm-1 200 replayed=true {"charge":"ch_1"}`,
		"again 200 replayed=true",
		"mismatch kind=7 isFingerprintMismatch=true action=pay:order-jvm-1",
		"closed kind=10 isClosed=true",
	}, got)

	reqs, charges := srv.snapshot()
	require.Len(t, reqs, 3, "the killed send, its resume, the send again (the other payload is refused before sending)")
	for _, r := range reqs {
		assert.Equal(t, key, r.Key)
	}
	assert.Equal(t, map[string]int{key: 1}, charges, "charged more than once")
}

// jvmTools returns the JDK's home and a C compiler, or skips the test
// (fails it when CI is set) if they are missing.
func jvmTools(t *testing.T) (jdk, cc string) {
	t.Helper()
	missing := func(what string) {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s is missing", what)
		}
		t.Skipf("%s is missing", what)
	}
	if home := os.Getenv("JAVA_HOME"); home != "" {
		jdk = home
	} else if javac, err := exec.LookPath("javac"); err == nil {
		if real, err := filepath.EvalSymlinks(javac); err == nil {
			jdk = filepath.Dir(filepath.Dir(real))
		}
	}
	if jdk == "" {
		missing("a JDK (javac, or JAVA_HOME)")
	}
	for _, f := range []string{"bin/javac", "bin/java", "include/jni.h", "include/linux/jni_md.h"} {
		if _, err := os.Stat(filepath.Join(jdk, f)); err != nil {
			missing(filepath.Join(jdk, f))
		}
	}
	cc = os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		missing("a C compiler (" + cc + ")")
	}
	return jdk, cc
}

// runIn runs name in dir with env (nil: the test's) and returns its
// stdout, failing the test with its output if it fails.
func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %s:\n%s%s", name, strings.Join(args, " "), out, stderr.String())
	return string(out)
}
