package idemretry_test

// How the Transport uses its journal: errors it passes on, the directory it
// locks, the journal it opens and closes (also when dropped), and the key
// that survives a SIGKILL in the default file journal.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

// wantPrefixOnce checks that err's message carries "idemretry:" once.
func wantPrefixOnce(t *testing.T, err error) {
	t.Helper()
	assert.Equal(t, 1, strings.Count(err.Error(), "idemretry:"), "%q", err.Error())
}

// The example: a RoundTrip on a closed file journal said
// `idemretry: reserve key for action "pay:1": idemretry: journal reserve
// "pay:1": idemretry: journal closed`. The prefix comes once.
func TestFileJournalErrorPrefixOnce(t *testing.T) {
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(t.TempDir()))
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, tr.Journal().Close()) // the journal stops under the Transport
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), "http://127.0.0.1:1/", "x"))
	require.ErrorIs(t, err, journal.ErrClosed)
	wantPrefixOnce(t, err)
}

// A bad option of the file journal given to WithJournalDir is a bad option
// of NewTransport: it wraps ErrInvalidOption (and the file journal's).
func TestJournalDirBadOption(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "j")
	_, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir, filejournal.WithLockWait(-time.Second)))
	require.ErrorIs(t, err, idemretry.ErrInvalidOption)
	assert.ErrorIs(t, err, filejournal.ErrInvalidOption)
	wantPrefixOnce(t, err)
	assert.NoDirExists(t, dir)
}

// Two Transports on one directory: the second is refused with
// filejournal.ErrLocked, and the error says what to do.
func TestSecondTransportOnDirLocked(t *testing.T) {
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer tr.Close()
	_, err = idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.ErrorIs(t, err, filejournal.ErrLocked)
	wantPrefixOnce(t, err)
	assert.Contains(t, err.Error(), dir)
	assert.Contains(t, err.Error(), "WithLockWait")
}

// filejournalGoroutines counts the frames of package filejournal in the
// stacks of all goroutines.
func filejournalGoroutines() int {
	return strings.Count(goroutineStacks(), "idemretry/filejournal.")
}

// A Transport that is dropped without Close closes the journal it opened
// once it is garbage collected: no goroutine is left, the lock is released.
func TestDroppedTransportReleasesJournal(t *testing.T) {
	srv := newPayServer(t)
	dir := t.TempDir()
	before := filejournalGoroutines()
	func() {
		tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
		require.NoError(t, err)
		roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:dropped"), srv.URL, "x"))
	}()
	deadline := time.Now().Add(5 * time.Second)
	for filejournalGoroutines() > before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	assert.LessOrEqual(t, filejournalGoroutines(), before, "the dropped Transport's journal is still running")
	again, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err, "the lock is released")
	require.NoError(t, again.Close())
}

// The GC cleanup of a dropped Transport leaves open the journal it opened
// when the app holds it through Journal().
func TestDroppedTransportLeavesHandedOutJournal(t *testing.T) {
	dir := t.TempDir()
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	j := tr.Journal()
	tr = nil
	for i := 0; i < 5; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	_, err = j.Unfinished(context.Background())
	t.Logf("Unfinished after dropping the Transport: %v", err)
	require.NoError(t, err)
}

// Issue 7, item 14: the journal directory deleted under a running process.
// The next new action is refused before anything is sent (its key could not
// be kept), Close reports it, and after a restart the action goes out once,
// under one key.
func TestJournalDirectoryRemovedUnderTransport(t *testing.T) {
	srv := newPayServer(t)
	dir := filepath.Join(t.TempDir(), "journal")
	tr, err := idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	roundTrip(t, tr, post(t, idemretry.WithAction(context.Background(), "pay:1"), srv.URL, "a"))

	require.NoError(t, os.RemoveAll(dir))
	ctx := idemretry.WithAction(context.Background(), "pay:2")
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	if err == nil {
		readAll(t, resp)
	}
	require.Error(t, err, "a new action was sent with a key kept in a deleted journal")
	assert.True(t, errors.Is(err, filejournal.ErrRemoved), "%v", err)
	assert.True(t, errors.Is(err, journal.ErrClosed), "%v", err)
	assert.Len(t, srv.seen(), 1, "nothing sent")
	err = tr.Close()
	assert.True(t, errors.Is(err, filejournal.ErrRemoved), "Close: %v", err)

	tr, err = idemretry.NewTransport(&http.Transport{}, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer tr.Close()
	roundTrip(t, tr, post(t, ctx, srv.URL, "b"))
	reqs := srv.seen()
	require.Len(t, reqs, 2)
	assert.Equal(t, 2, srv.chargeCount())
}

// hangingReserve is a journal whose Reserve hangs until its context ends.
type hangingReserve struct{ *journal.Memory }

func (h hangingReserve) Reserve(ctx context.Context, rec journal.Record, mode journal.ReserveMode) (journal.Record, bool, error) {
	<-ctx.Done()
	return journal.Record{}, false, ctx.Err()
}

// A journal that does not answer within the journal timeout is reported as
// unavailable, and nothing is sent.
func TestJournalTimeoutIsUnavailable(t *testing.T) {
	srv := newPayServer(t)
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(hangingReserve{journal.NewMemory()}),
		idemretry.WithJournalTimeout(100*time.Millisecond))
	require.NoError(t, err)
	defer tr.Close()
	start := time.Now()
	_, err = tr.RoundTrip(post(t, context.Background(), srv.URL, `{"amount":1}`))
	assert.ErrorIs(t, err, journal.ErrUnavailable)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Empty(t, srv.seen())
	_, err = idemretry.NewTransport(nil, inMemory(), idemretry.WithJournalTimeout(0))
	assert.ErrorIs(t, err, idemretry.ErrInvalidOption)
}

// deadlineWithoutDone is a broken context: it reports a deadline but no
// Done channel, so nothing ever tells a wait on it that the deadline came.
type deadlineWithoutDone struct{ context.Context }

func (deadlineWithoutDone) Deadline() (time.Time, bool) {
	return time.Now().Add(50 * time.Millisecond), true
}
func (deadlineWithoutDone) Done() <-chan struct{} { return nil }

// A journal call is bounded by the journal timeout even when the caller's
// context claims an earlier deadline it cannot signal (Done is nil): the
// deadline stands in for the journal timeout only when it can end the call.
func TestJournalTimeoutBoundsAContextWithADeadlineButNoDone(t *testing.T) {
	_, err := reserveUnder(t, deadlineWithoutDone{context.Background()})
	require.ErrorIs(t, err, journal.ErrUnavailable)
}

// stallingLeaser is a Memory journal whose first Lease is granted (after
// 2 ms, so that the lease is due for renewal by the first attempt) and
// whose renewals stall until their context ends.
type stallingLeaser struct {
	*journal.Memory
	calls atomic.Int32
}

func (l *stallingLeaser) Lease(ctx context.Context, _, _ string, ttl time.Duration) (bool, time.Time, error) {
	if l.calls.Add(1) == 1 {
		time.Sleep(2 * time.Millisecond)
		return true, time.Now().Add(ttl), nil
	}
	<-ctx.Done()
	return false, time.Time{}, ctx.Err()
}

func (l *stallingLeaser) Release(context.Context, string, string) error { return nil }

// The renewal of a lease before an attempt is bounded like any journal
// call: a caller's context that reports a deadline but has no Done channel
// does not leave it waiting on a stalled journal.
func TestLeaseRenewalBoundsAContextWithADeadlineButNoDone(t *testing.T) {
	srv := newPayServer(t)
	j := &stallingLeaser{Memory: journal.NewMemory()}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j), idemretry.WithLeaseTTL(time.Millisecond),
		idemretry.WithJournalTimeout(300*time.Millisecond))
	require.NoError(t, err)
	defer tr.Close()
	done := make(chan error, 1)
	go func() {
		ctx := idemretry.WithAction(deadlineWithoutDone{context.Background()}, "pay:lease")
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, `{"amount":1}`))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("RoundTrip still waiting for the lease's renewal 20 s after a 300 ms journal timeout")
	}
	require.GreaterOrEqual(t, j.calls.Load(), int32(2), "the lease was never renewed: the test proves nothing")
	require.Len(t, srv.seen(), 1)
}

// Error messages carry the package prefix once, however deep the wrapping.
func TestErrorPrefixOnce(t *testing.T) {
	j := journal.NewMemory()
	require.NoError(t, j.Close())
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournal(j))
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), "http://127.0.0.1:1/", "x"))
	require.ErrorIs(t, err, journal.ErrClosed)
	wantPrefixOnce(t, err)
}

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

// Issue 30, item 6: a process killed (SIGKILL) during its payment's first
// attempt, after the server charged it, left a record that Unfinished
// listed with 0 attempts, which reads as "nothing sent". The first attempt
// is counted when the key is reserved, durably, before it leaves.
func TestUnfinishedCountsTheFirstAttemptAfterAKill(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	committed := make(chan struct{}, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		committed <- struct{}{} // charged; the answer never leaves
		<-r.Context().Done()
	})
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestJournalE2EChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", envE2EChild+"="+dir, envE2EURL+"="+srv.URL)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	select {
	case <-committed:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the first attempt never reached the server")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	defer j.Close()
	recs, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "pay:order-A-1001", recs[0].ActionID)
	assert.Equal(t, journal.StatePending, recs[0].State)
	assert.GreaterOrEqual(t, recs[0].Attempts, 1, "a charged payment listed as never attempted")
}
