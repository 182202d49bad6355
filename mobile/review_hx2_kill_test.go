//go:build linux || darwin

package idemretry_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemretry "github.com/idemretry/idemretry/mobile"
)

const envHX2Child = "IDEMRETRY_MOBILE_HX2_CHILD"

// TestReviewHX2Child is the app the kill test below kills: the user taps
// Pay twice, from two threads, and the app is killed before the answer.
func TestReviewHX2Child(t *testing.T) {
	if os.Getenv(envHX2Child) == "" {
		t.Skip("child process of TestReviewHX2DoubleTapKilledThenResumeAndTap")
	}
	c, err := idemretry.NewClient(os.Getenv(envDir), nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := idemretry.NewRequest("POST", os.Getenv(envURL)+"/charges")
			r.Body, r.ActionID = []byte(`{"amount":4200}`), "pay:checkout-7"
			_, err := c.Send(r)
			fmt.Println("answered", err)
		}()
	}
	wg.Wait()
	os.Exit(4) // never: the answer is held until the kill
}

// hX2's review: a double tap (two threads) in flight when the app is
// killed with SIGKILL after the server charged. At the next start the app
// resumes on a background thread while the restored checkout screen sends
// the same action at once. One charge, one key, and both are told it was
// paid.
func TestReviewHX2DoubleTapKilledThenResumeAndTap(t *testing.T) {
	srv := newPayServer(t)
	srv.setAfterCommit(holdUntilGone)
	dir := filepath.Join(t.TempDir(), "idemretry")
	cmd := exec.Command(os.Args[0], "-test.run=^TestReviewHX2Child$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", envHX2Child+"=1", envDir+"="+dir, envURL+"="+srv.URL)
	app, _ := startApp(t, cmd)
	key := killAfterCommit(t, srv, app)
	require.Equal(t, 1, srv.requestCount(), "the double tap sent two requests")

	c, err := idemretry.NewClient(dir, nil)
	require.NoError(t, err)
	defer c.Close()
	pay := func() *idemretry.Request {
		r := idemretry.NewRequest("POST", srv.URL+"/charges")
		r.Body, r.ActionID = []byte(`{"amount":4200}`), "pay:checkout-7"
		return r
	}
	var wg sync.WaitGroup
	var out *idemretry.OutcomeList
	var resumeErr, tapErr error
	var tap *idemretry.Response
	wg.Add(2)
	go func() {
		defer wg.Done()
		out, resumeErr = c.Resume(rebuildWith(func(string) (*idemretry.Request, error) { return pay(), nil }))
	}()
	go func() {
		defer wg.Done()
		tap, tapErr = c.Send(pay())
	}()
	wg.Wait()
	require.NoError(t, resumeErr)
	require.NoError(t, tapErr)
	assert.EqualValues(t, 200, tap.Status)
	for i := int32(0); i < out.Len(); i++ { // the tap may have finished it first
		o := out.Get(i)
		require.NotNil(t, o.Response, "%+v", o.Failure)
		assert.True(t, o.Response.Replayed)
	}
	reqs, charges := srv.snapshot()
	assert.Equal(t, map[string]int{key: 1}, charges)
	for _, r := range reqs {
		assert.Equal(t, key, r.Key)
	}
	l, err := c.Unfinished()
	require.NoError(t, err)
	assert.EqualValues(t, 0, l.Len())
}
