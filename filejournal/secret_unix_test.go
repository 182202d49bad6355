//go:build unix

package filejournal

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fingerprint.key a FIFO (or any non-regular file): Open must not block
// reading it.
func TestSecretFIFODoesNotHang(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, secretName)
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	type res struct {
		j   *Journal
		err error
	}
	ch := make(chan res, 1)
	go func() {
		j, err := Open(dir)
		ch <- res{j, err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		_, ok := r.j.FingerprintSecret(r.j)
		require.False(t, ok)
		require.ErrorIs(t, r.j.Recovery().FingerprintSecretErr, ErrCorrupt)
		require.NoError(t, r.j.Close())
	case <-time.After(20 * time.Second):
		// Unblock the reader so that the goroutine ends.
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			_ = f.Close()
		}
		r := <-ch
		if r.j != nil {
			_ = r.j.Close()
		}
		t.Fatal("Open blocked reading a FIFO fingerprint.key")
	}
}
