package lockfile

import (
	"path/filepath"
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
