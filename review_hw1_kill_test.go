package idemretry_test

// hW1's review: the default path (unnamed, the file journal, an
// http.Client) when the app is killed with SIGKILL after the server
// committed the charge and before the answer reached it, directly or on
// a 307's hop; then a new process on the same journal taps again, or
// resumes.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/journal"
)

const (
	envKillDir = "IDEMRETRY_HW1_KILL_DIR"
	envKillURL = "IDEMRETRY_HW1_KILL_URL"
)

// holdingLedger charges a key once and replays it after; the first
// charge of each payload is committed and then its answer is held until
// the test ends (the app is killed meanwhile).
type holdingLedger struct {
	mu        sync.Mutex
	charged   map[string]bool
	held      bool
	committed chan struct{}
	release   chan struct{}
	keys      []string
}

func (l *holdingLedger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.URL.Path == "/redir" {
		w.Header().Set("Location", "/pay")
		w.WriteHeader(http.StatusTemporaryRedirect)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	l.keys = append(l.keys, key)
	if l.charged[key] {
		l.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		return
	}
	l.charged[key] = true
	hold := !l.held && l.committed != nil
	l.held = true
	l.mu.Unlock()
	if hold {
		close(l.committed)
		<-l.release
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func (l *holdingLedger) charges() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.charged)
}

// TestKilledUnnamedPaymentChild is the app the tests below kill: it pays one unnamed
// payment through an http.Client over the default file journal and never
// closes anything.
//
// Found in review hw1 (f949e43; was TestHW1KillChild).
func TestKilledUnnamedPaymentChild(t *testing.T) {
	dir := os.Getenv(envKillDir)
	if dir == "" {
		t.Skip("the child process of review_hw1_kill_test.go")
	}
	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Post(os.Getenv(envKillURL), "application/json", strings.NewReader(`{"amount":42}`))
	if err == nil {
		resp.Body.Close()
	}
	fmt.Println("paid:", err)
	select {}
}

// urlResumer rebuilds the unnamed payment.
type urlResumer struct{ url string }

func (r urlResumer) Rebuild(ctx context.Context, rec journal.Record) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPost, r.url, strings.NewReader(`{"amount":42}`))
}

func (urlResumer) Resolve(context.Context, journal.Record) (bool, error) { return false, nil }

// Found in review hw1 (f949e43; was TestHW1KilledMidChargeThenTapOrResume).
func TestKilledMidChargeThenTapOrResume(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	for _, c := range []struct {
		name, path string
		resume     bool
	}{
		{"tap", "/pay", false},
		{"resume then tap", "/pay", true},
		{"tap, the charge on a 307's hop", "/redir", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := &holdingLedger{charged: map[string]bool{}, committed: make(chan struct{}), release: make(chan struct{})}
			srv := httptest.NewServer(l)
			defer srv.Close()
			defer close(l.release)
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledUnnamedPaymentChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envKillDir+"="+dir, envKillURL+"="+srv.URL+c.path)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			select {
			case <-l.committed:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("the child's charge never arrived: %s", out.String())
			}
			require.NoError(t, cmd.Process.Kill()) // SIGKILL: no Close, no outcome
			_ = cmd.Wait()

			tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
			require.NoError(t, err)
			defer func() { require.NoError(t, tr.Close()) }()
			un, err := tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			require.NotEmpty(t, un, "the killed payment is not pending")
			if c.resume {
				res, err := tr.Resume(context.Background(), urlResumer{srv.URL + c.path}, 0)
				require.NoError(t, err)
				require.Len(t, res, 1)
				require.NoError(t, res[0].Err)
				assert.Equal(t, http.StatusCreated, res[0].Status)
			}
			resp, err := (&http.Client{Transport: tr}).Post(srv.URL+c.path, "application/json", strings.NewReader(`{"amount":42}`))
			require.NoError(t, err)
			resp.Body.Close()
			if c.resume {
				// Resumed to done: this tap is a deliberate repeat.
				assert.False(t, idemretry.IsReplay(resp))
				assert.Equal(t, 2, l.charges(), "keys %v", l.keys)
			} else {
				assert.True(t, idemretry.IsReplay(resp), "the tap of the killed payment was not its replay")
				assert.Equal(t, 1, l.charges(), "the tap of the killed payment charged again: keys %v", l.keys)
			}
			un, err = tr.Journal().Unfinished(context.Background())
			require.NoError(t, err)
			assert.Empty(t, un)
		})
	}
}

// Guarantee 6 for an unnamed payment that was redirected: once the app
// was given the hop's final answer, a deliberate repeat is a new payment,
// also when the app is killed right after (no Close, within the file
// journal's lazy second): the hop's done is as durable as an unnamed
// action's own.
//
// Found in review hw1 (f949e43; was TestHW1KilledAfterARedirectedUnnamedPaymentThenRepeat).
func TestKilledAfterARedirectedUnnamedPaymentThenRepeat(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	l := &holdingLedger{charged: map[string]bool{}}
	srv := httptest.NewServer(l)
	defer srv.Close()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledUnnamedPaymentChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envKillDir+"="+dir, envKillURL+"="+srv.URL+"/redir")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "paid:") {
				line <- sc.Text()
				return
			}
		}
		close(line)
	}()
	var got string
	select {
	case got = <-line:
	case <-time.After(20 * time.Second):
	}
	require.NoError(t, cmd.Process.Kill()) // at once: no Close
	_ = cmd.Wait()
	require.Equal(t, "paid: <nil>", got)
	require.Equal(t, 1, l.charges())

	tr, err := idemretry.NewTransport(nil, idemretry.WithJournalDir(dir))
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL+"/redir", "application/json", strings.NewReader(`{"amount":42}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.False(t, idemretry.IsReplay(resp), "the deliberate repeat was answered with the first payment's replay")
	assert.Equal(t, 2, l.charges(), "keys %v", l.keys)
}
