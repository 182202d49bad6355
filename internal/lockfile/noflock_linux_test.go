//go:build linux && (amd64 || arm64)

package lockfile

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A process in which flock(2) fails with ENOSYS (Android 14, a seccomp
// policy) is made for real: a child of the test installs a seccomp filter
// that answers every flock with ENOSYS, so Acquire takes its
// open-file-description fallback.

const (
	envNoFlockChild = "LOCKFILE_NOFLOCK_CHILD" // hold, try or wait
	envNoFlockPath  = "LOCKFILE_NOFLOCK_PATH"
)

// denyFlock installs, for every thread of the process, a seccomp filter
// under which flock fails with ENOSYS.
func denyFlock() error {
	arch := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: arch, Jt: 0, Jf: 3},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_FLOCK, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return e
	}
	runtime.KeepAlive(prog)
	return nil
}

// TestNoFlockChild is the child: it does nothing in a normal run.
func TestNoFlockChild(t *testing.T) {
	mode := os.Getenv(envNoFlockChild)
	if mode == "" {
		t.Skip("child process of the no-flock tests")
	}
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	if err := denyFlock(); err != nil {
		say("error seccomp: %v", err)
		os.Exit(3)
	}
	f, _ := os.CreateTemp("", "probe")
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.ENOSYS) {
		say("error flock still works: %v", err)
		os.Exit(3)
	}
	f.Close()
	os.Remove(f.Name())
	path := os.Getenv(envNoFlockPath)
	wait := time.Duration(0)
	if mode == "wait" {
		wait = 20 * time.Second
	}
	l, err := Acquire(path, wait)
	switch {
	case errors.Is(err, ErrLocked):
		say("locked")
		os.Exit(0)
	case err != nil:
		say("error %v", err)
		os.Exit(3)
	}
	// A second owner in this process is excluded too.
	if _, err := Acquire(path, 0); !errors.Is(err, ErrLocked) {
		say("error second Acquire in the same process: %v", err)
		os.Exit(3)
	}
	if mode != "hold" {
		say("acquired")
		_ = l.Release()
		os.Exit(0)
	}
	say("held")
	select {} // until SIGKILLed
}

// noFlockChild starts a child in mode on path and returns it with its
// first line.
func noFlockChild(t *testing.T, mode, path string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoFlockChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envNoFlockChild+"="+mode, envNoFlockPath+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "error seccomp") {
		t.Skipf("no seccomp here: %s", line)
	}
	return cmd, line
}

// Without flock: the fallback excludes a second owner in the holder's
// process (checked in the child) and in another process.
func TestLockWithoutFlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "LOCK")
	holder, first := noFlockChild(t, "hold", path)
	if first != "held" {
		t.Fatalf("holder: %q", first)
	}
	if _, got := noFlockChild(t, "try", path); got != "locked" {
		t.Fatalf("a second process without flock: %q, want locked", got)
	}
	_ = holder
}

// Without flock, kill -9 releases the lock: a waiter started before the
// kill gets it.
func TestLockWithoutFlockReleasedBySIGKILL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "LOCK")
	holder, first := noFlockChild(t, "hold", path)
	if first != "held" {
		t.Fatalf("holder: %q", first)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = holder.Process.Signal(syscall.SIGKILL)
	}()
	if _, got := noFlockChild(t, "wait", path); got != "acquired" {
		t.Fatalf("a waiter after the holder's SIGKILL: %q, want acquired", got)
	}
}

// A process where flock works and one where it is missing must still
// exclude each other: both are owners of the same directory otherwise.
func TestLockWithoutFlockExcludesAFlockOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "LOCK")
	_, first := noFlockChild(t, "hold", path)
	if first != "held" {
		t.Fatalf("holder: %q", first)
	}
	l, err := Acquire(path, 0)
	if err == nil {
		_ = l.Release()
		t.Fatalf("this process (flock) acquired the lock a process without flock holds (OFD lock): two owners")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatal(err)
	}
	// And the other way round.
	path2 := filepath.Join(t.TempDir(), "LOCK")
	l2, err := Acquire(path2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release()
	if _, got := noFlockChild(t, "try", path2); got != "locked" {
		t.Fatalf("a process without flock, beside a flock holder: %q, want locked", got)
	}
}
