package lockfile

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExclusiveWithinProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "LOCK")
	l, err := Acquire(path, 0)
	require.NoError(t, err)
	_, err = Acquire(path, 0)
	assert.ErrorIs(t, err, ErrLocked)

	start := time.Now()
	_, err = Acquire(path, 60*time.Millisecond)
	assert.ErrorIs(t, err, ErrLocked)
	assert.GreaterOrEqual(t, time.Since(start), 60*time.Millisecond)

	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = l.Release()
	}()
	l2, err := Acquire(path, 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, l2.Release())
	require.NoError(t, l2.Release(), "second Release")
	var nilLock *Lock
	assert.NoError(t, nilLock.Release())
}

// The holder records its process id; a waiter can read it (not on Windows,
// where the locked byte cannot be read by others).
func TestHolderPID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "LOCK")
	assert.Zero(t, Holder(path), "no lock file")
	l, err := Acquire(path, 0)
	require.NoError(t, err)
	if runtime.GOOS != "windows" {
		assert.Equal(t, os.Getpid(), Holder(path))
	}
	require.NoError(t, l.Release())
}
