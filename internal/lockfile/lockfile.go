// Package lockfile takes an exclusive, advisory, per-open-file lock on a
// file, to give a directory one owner at a time.
//
// The lock belongs to the open file description, not to the process: a second
// Acquire of the same path in the same process conflicts with the first, just
// as one from another process does. The operating system releases the lock
// when its holder exits, however it exits (kill -9 included), so a crashed
// owner never leaves a stale lock behind.
//
// Lock a file that is never renamed or replaced: a lock on an inode that a
// rename swapped out excludes nobody.
//
// Mechanisms: flock(2) on Linux, the BSDs, darwin and ios. On Linux (and so
// Android, where flock has been reported to fail with ENOSYS, and under
// seccomp policies that filter it) an open-file-description fcntl lock
// (F_OFD_SETLK) is taken beside flock, or alone where flock fails: the two
// kinds do not see each other, so a process without flock is excluded only
// by an owner that holds both. Classic POSIX fcntl locks are never used:
// they do not exclude within one process and are dropped when any descriptor
// of the file is closed. LockFileEx on Windows.
package lockfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrLocked means another owner, in this process or another one, holds the
// lock. Test it with errors.Is.
var ErrLocked = errors.New("lockfile: locked by another owner")

// errBusy is what the per-OS tryLock returns when the lock is held.
var errBusy = errors.New("lock busy")

// pollInterval is how often Acquire retries while waiting. The OS calls that
// wait cannot be cancelled, so waiting is a polling loop.
const pollInterval = 10 * time.Millisecond

// Lock is a held lock. Release it exactly once; it is not safe for
// concurrent use.
type Lock struct {
	f *os.File
}

// Acquire opens (creating it with mode 0600 if needed) and locks path. If
// another owner holds the lock, Acquire retries until wait has passed and then
// returns an error wrapping ErrLocked; a wait of zero or less fails at once.
func Acquire(path string, wait time.Duration) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err // an *fs.PathError: "open <path>: ..."
	}
	deadline := time.Now().Add(wait)
	for {
		err := tryLock(f)
		if err == nil {
			writePID(f)
			return &Lock{f: f}, nil
		}
		if !errors.Is(err, errBusy) {
			_ = f.Close()
			return nil, &fs.PathError{Op: "lock", Path: path, Err: err}
		}
		left := time.Until(deadline)
		if left <= 0 {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		time.Sleep(min(left, pollInterval))
	}
}

// writePID records the holder's process id in the lock file, for Holder.
// It is a hint for error messages only: not synced, and errors are ignored.
func writePID(f *os.File) {
	if f.Truncate(0) == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
}

// Holder returns the process id that the holder of the lock on path
// recorded, or 0 if it cannot be read (on Windows, the locked file cannot
// be read by others). It may name a holder that has just released the lock.
func Holder(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var b [24]byte
	n, _ := f.Read(b[:])
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Release unlocks and closes the lock file. The file stays in place: removing
// it would let a waiter lock an inode that a newer owner no longer sees.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	uerr := unlock(l.f)
	cerr := l.f.Close()
	l.f = nil
	return errors.Join(uerr, cerr)
}

// control runs fn on f's descriptor (a handle on Windows) and returns fn's
// error.
func control(f *os.File, fn func(fd uintptr) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(fd) }); err != nil {
		return err
	}
	return ferr
}
