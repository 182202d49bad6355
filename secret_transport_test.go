package idemretry_test

// The file journal's fingerprint secret across a restart, over loopback
// HTTP: a large named payment (its fingerprint keyed under fingerprint.key)
// is charged and its answer lost while a child process sends it; the child
// is SIGKILLed; a new Transport on the same directory resends it under the
// same key, or, when fingerprint.key is gone or damaged, refuses it with
// nothing sent.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
	"github.com/idemretry/idemretry/journal"
)

const (
	envSecretDir = "IDEMRETRY_SECRET_DIR"
	envSecretURL = "IDEMRETRY_SECRET_URL"
	secretAction = "pay:big-order-7"
)

// secretBody is the large payment body: 96 KiB, over the keyed threshold.
var secretBody = bytes.Repeat([]byte(`{"amount":1000,"note":"x"}`), 96<<10/26+1)

func secretRequest(t testing.TB, ctx context.Context, url string) *http.Request {
	req, err := http.NewRequestWithContext(idemretry.WithAction(ctx, secretAction), http.MethodPost, url+"/charges", bytes.NewReader(secretBody))
	require.NoError(t, err)
	require.EqualValues(t, len(secretBody), req.ContentLength)
	return req
}

// TestSecretRestartChild is the child of TestSecretRestart*: it pays the
// large order through a Transport on the journal in envSecretDir. The
// parent kills it once the server has committed the charge.
func TestSecretRestartChild(t *testing.T) {
	dir := os.Getenv(envSecretDir)
	if dir == "" {
		t.Skip("child process of TestSecretRestart")
	}
	tr, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournalDir(dir))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	fmt.Println("sending")
	resp, err := tr.RoundTrip(secretRequest(t, context.Background(), os.Getenv(envSecretURL)))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(4)
	}
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode) // the parent kills before this
	os.Exit(0)
}

// secretLedger charges a key once, holding the first answer until the
// client is gone (the answer lost after the commit), and replays after.
type secretLedger struct {
	mu        sync.Mutex
	keys      []string
	bodyOK    []bool
	charges   map[string]int
	committed chan struct{}
}

func (l *secretLedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	l.keys = append(l.keys, key)
	l.bodyOK = append(l.bodyOK, bytes.Equal(b, secretBody))
	first := l.charges[key] == 0
	if first {
		l.charges[key]++
	}
	l.mu.Unlock()
	if first {
		l.committed <- struct{}{}
		<-r.Context().Done()
		return
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(http.StatusCreated)
}

func (l *secretLedger) seen() (keys []string, charges int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.charges {
		charges += n
	}
	for _, ok := range l.bodyOK {
		if !ok {
			panic("a body arrived changed")
		}
	}
	return append([]string(nil), l.keys...), charges
}

// chargeAndKill runs the child until the server committed its charge, then
// SIGKILLs it. It returns the key the charge was made under.
func chargeAndKill(t *testing.T, dir string, l *secretLedger, url string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSecretRestartChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", envSecretDir+"="+dir, envSecretURL+"="+url)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	go func() { _, _ = io.Copy(io.Discard, bufio.NewReader(out)) }()
	select {
	case <-l.committed:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the child's payment never reached the server")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	keys, charges := l.seen()
	require.Len(t, keys, 1)
	require.NotEmpty(t, keys[0])
	require.Equal(t, 1, charges)
	// The record's fingerprint is keyed (magic "irk\x01"), unless this CPU
	// lacks AES-GCM in hardware (then plain SHA-256: nothing to test).
	j, err := filejournal.Open(dir)
	require.NoError(t, err)
	un, err := j.Unfinished(context.Background())
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.Len(t, un, 1)
	require.Equal(t, keys[0], un[0].Key)
	if string(un[0].Fingerprint[:4]) != "irk\x01" {
		t.Skip("this CPU makes plain fingerprints (no AES-GCM in hardware)")
	}
	return keys[0]
}

func newSecretLedger(t *testing.T) (*secretLedger, string) {
	l := &secretLedger{charges: map[string]int{}, committed: make(chan struct{}, 1)}
	srv := newServer(t, l.ServeHTTP)
	return l, srv.URL
}

// secretResumer rebuilds the large order.
type secretResumer struct {
	t   *testing.T
	url string
}

func (r secretResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return secretRequest(r.t, ctx, r.url), nil
}

func (r secretResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

func TestSecretRestartResends(t *testing.T) {
	l, url := newSecretLedger(t)
	dir := t.TempDir()
	key := chargeAndKill(t, dir, l, url)
	_, err := os.Stat(filepath.Join(dir, "fingerprint.key"))
	require.NoError(t, err)

	tr, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(secretRequest(t, context.Background(), url))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, idemretry.IsReplay(resp))
	keys, charges := l.seen()
	require.Equal(t, []string{key, key}, keys)
	require.Equal(t, 1, charges)
}

// requireUncheckable checks an *ActionError refusing the resend of the
// action charged under key.
func requireUncheckable(t *testing.T, err error, key string) {
	t.Helper()
	var ae *idemretry.ActionError
	require.ErrorAs(t, err, &ae)
	require.True(t, ae.MaybeProcessed)
	require.Equal(t, key, ae.Key)
	require.Equal(t, secretAction, ae.Action)
	require.Contains(t, err.Error(), "cannot be checked")
	require.Equal(t, 1, strings.Count(err.Error(), "idemretry: "), err.Error())
}

func testSecretRestartRefused(t *testing.T, damage func(path string)) *bytes.Buffer {
	l, url := newSecretLedger(t)
	dir := t.TempDir()
	key := chargeAndKill(t, dir, l, url)
	damage(filepath.Join(dir, "fingerprint.key"))

	var logs bytes.Buffer
	tr, err := idemretry.NewTransport(http.DefaultTransport, idemretry.WithJournalDir(dir),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))))
	require.NoError(t, err)
	defer tr.Close()
	resp, err := tr.RoundTrip(secretRequest(t, context.Background(), url))
	if resp != nil {
		resp.Body.Close()
	}
	require.Nil(t, resp)
	requireUncheckable(t, err, key)

	res, err := tr.Resume(context.Background(), secretResumer{t, url}, 1)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, secretAction, res[0].Record.ActionID)
	require.False(t, res[0].Sent)
	requireUncheckable(t, res[0].Err, key)

	keys, charges := l.seen()
	require.Equal(t, []string{key}, keys, "something was sent")
	require.Equal(t, 1, charges)
	return &logs
}

func TestSecretRestartKeyDeleted(t *testing.T) {
	logs := testSecretRestartRefused(t, func(path string) { require.NoError(t, os.Remove(path)) })
	require.Contains(t, logs.String(), "made a fingerprint secret for a journal that holds records",
		"NewTransport did not warn of a secret made anew:\n%s", logs.String())
}

func TestSecretRestartKeyDamaged(t *testing.T) {
	var path string
	logs := testSecretRestartRefused(t, func(p string) {
		path = p
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		b[40] ^= 0x04 // in the secret
		require.NoError(t, os.WriteFile(p, b, 0o600))
	})
	require.Contains(t, logs.String(), "fingerprint", "NewTransport did not log the missing fingerprint secret:\n%s", logs.String())
	require.Contains(t, logs.String(), path)
}

// syncWriter serialises a logger's writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
