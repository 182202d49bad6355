//go:build linux || darwin

package idemretry_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

const (
	envE2EChild = "IDEMRETRY_E2E_CHILD" // the journal directory
	envE2EURL   = "IDEMRETRY_E2E_URL"
)

// TestJournalE2EChild is the child of TestJournalSurvivesKill: it pays one
// order through a default-style Client whose journal is in the given
// directory, and prints the response's status. It does nothing in a normal
// run.
func TestJournalE2EChild(t *testing.T) {
	dir := os.Getenv(envE2EChild)
	if dir == "" {
		t.Skip("child process of TestJournalSurvivesKill")
	}
	c, err := idemretry.NewClient(idemretry.WithJournalDir(dir))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	ctx := idemretry.WithAction(context.Background(), "pay:order-A-1001")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv(envE2EURL)+"/charges", strings.NewReader(`{"amount":1000}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(4)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode)
	_ = c.Close()
	os.Exit(0)
}

// The end-to-end test of issue 3: a process is killed (SIGKILL) while its
// payment is in flight, after the server committed the charge but before the
// answer came back. The restarted process resends; the server sees the same
// Idempotency-Key and charges once.
func TestJournalSurvivesKill(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	charges := map[string]int{} // key -> charges made
	committed := make(chan struct{}, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		keys = append(keys, key)
		first := charges[key] == 0
		if first {
			charges[key]++ // committed
		}
		mu.Unlock()
		if first {
			// Drop the answer: hold it until the client is gone.
			committed <- struct{}{}
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusOK) // a replay of the stored answer
	})
	dir := t.TempDir()

	run := func() (*exec.Cmd, *bufio.Reader) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestJournalE2EChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", envE2EChild+"="+dir, envE2EURL+"="+srv.URL)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		return cmd, bufio.NewReader(out)
	}

	cmd, _ := run()
	select {
	case <-committed:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the first attempt never reached the server")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	cmd, out := run()
	line, _ := out.ReadString('\n')
	_ = cmd.Wait()
	assert.Equal(t, "status 200\n", line)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, keys, 2)
	assert.NotEmpty(t, keys[0])
	assert.Equal(t, keys[0], keys[1], "the restarted process used another key")
	assert.Len(t, charges, 1)
	assert.Equal(t, 1, charges[keys[0]], "charged more than once")
}
