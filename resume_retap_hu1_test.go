package idemretry_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
	"github.com/idemretry/idemretry/filejournal"
)

const (
	envRetapDir = "IDEMRETRY_HU1_RETAP_DIR" // set only in the child
	envRetapURL = "IDEMRETRY_HU1_RETAP_URL"
)

// TestResumeKillLoopRetapChild is the app of
// TestResumeKillLoopRetapRule: it pays unnamed order 1 through a base
// transport that announces the request and never sends it, so that it is
// killed with the key durably reserved and nothing on the wire.
//
// Found in review hu1 (4b7b2ab; was TestResumeKillLoopRetapChildHU1).
func TestResumeKillLoopRetapChild(t *testing.T) {
	dir := os.Getenv(envRetapDir)
	if dir == "" {
		t.Skip("child process of TestResumeKillLoopRetapRule")
	}
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		fmt.Fprintf(os.Stdout, "hu1 sending %s\n", r.Header.Get("Idempotency-Key"))
		time.Sleep(time.Hour) // killed here
		return nil, context.Canceled
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithKeyWindow(time.Minute))
	if err != nil {
		fmt.Fprintf(os.Stdout, "hu1 open-error %v\n", err)
		os.Exit(3)
	}
	req, _ := http.NewRequest(http.MethodPost, os.Getenv(envRetapURL)+"/charge", strings.NewReader(rkBody(1, true)))
	_, _ = tr.RoundTrip(req)
	os.Exit(4)
}

// TestResumeKillLoopRetapRule checks the rule by which TestResumeKillLoop
// has the app tap an unnamed order again (rkMayRetap) against the case it
// must refuse: the app was killed (SIGKILL) after the order's key was
// durably reserved and before any request of it reached the server. No
// arrival at the server, nothing resolved, yet the journal holds the action
// pending: the next run's Resume sends it under its key, and a tap of the
// same unnamed payment after Resume's flight landed is, as the README says
// ("What an unnamed request cannot know"), a deliberate repeat: a new key, a
// second charge. The kill loop then reports "order N (unnamed true) charged
// 2 times" although the Transport did what it promises. Over real loopback
// HTTP, with the kill loop's own server, app and rule.
//
// Found in review hu1 (4b7b2ab; was TestResumeKillLoopRetapRuleHU1).
func TestResumeKillLoopRetapRule(t *testing.T) {
	if testing.Short() {
		t.Skip("child process")
	}
	led := newRKLedger(1)
	srv := httptest.NewServer(led)
	defer srv.Close()
	dir := t.TempDir()

	// Run 1: killed between the reserve and the send.
	cmd := exec.Command(os.Args[0], "-test.run=^TestResumeKillLoopRetapChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", envRetapDir+"="+dir, envRetapURL+"="+srv.URL)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	keyc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if k, ok := strings.CutPrefix(sc.Text(), "hu1 sending "); ok {
				keyc <- k
			}
		}
		close(keyc)
	}()
	var key1 string
	select {
	case key1 = <-keyc:
	case <-time.After(60 * time.Second):
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.NotEmpty(t, key1, "the child never came to send order 1")
	require.Zero(t, led.arrivals(1), "nothing of order 1 reached the server")

	// Between the runs: the kill loop's rule.
	st := &rkState{resolvedCharged: map[int][]string{}}
	var j *filejournal.Journal
	may, err := rkMayRetap(&j, dir, t.TempDir(), false, srv.URL, st, led, 1)
	require.NoError(t, err)
	if j != nil {
		require.NoError(t, j.Close())
	}

	// Run 2: Resume at start-up; the user taps Pay again, here once
	// Resume has finished (in the kill loop, whenever its op comes up).
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(dir), idemretry.WithKeyWindow(time.Minute),
		idemretry.WithBackOff(func() backoff.BackOff { return idemretry.NewFullJitter(40*time.Millisecond, 200*time.Millisecond, nil) }),
		idemretry.WithMaxRetries(5))
	require.NoError(t, err)
	app := &rkApp{url: srv.URL, say: t.Logf, rng: rand.New(rand.NewPCG(1, 3)), next: 2,
		unnamed: map[int]bool{1: true}, paid: map[int]bool{}, inProgress: map[int]int{}}
	results, err := tr.Resume(context.Background(), app, 0)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.Equal(t, key1, results[0].Record.Key, "Resume sends the pending action under its key")
	require.True(t, results[0].Sent)
	require.Equal(t, http.StatusCreated, results[0].Status)
	if may {
		app.pay(tr, 1, true, "retap")
	}
	require.NoError(t, tr.Close())

	led.mu.Lock()
	keys := append([]string(nil), led.charges[1]...)
	led.mu.Unlock()
	require.Len(t, keys, 1, "order 1 (unnamed true) charged %d times under %v: rkMayRetap let the app pay again an unnamed order whose pending key the next run's Resume sends", len(keys), keys)
	require.Equal(t, key1, keys[0])
}
