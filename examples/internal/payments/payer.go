package payments

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// payer is one incarnation of a client process: it pays intents until it
// is closed, or killed.
type payer interface {
	// pay makes one payment with retries; it reports success. When ctx is
	// cancelled (the process is being killed) it returns promptly.
	pay(ctx context.Context, in *Intent) bool
	// crash drops the payer as a dying process would: nothing is marked
	// done, files are let go, connections are cut.
	crash()
	// close shuts the payer down cleanly at the end of the run.
	close() error
}

// newBase returns the HTTP transport of one client process. Its
// ResponseHeaderTimeout is the per-attempt timeout: the client gives up on
// an attempt that has not answered in time, and the server's late answer
// goes nowhere.
func newBase(clk *Clock, attemptTimeout time.Duration) *http.Transport {
	return newBaseIdle(clk, attemptTimeout, 4)
}

// newBaseIdle is newBase keeping up to idle connections open: a process
// with many payments in flight at once needs more than 4, or it opens and
// closes a connection for nearly every request.
func newBaseIdle(clk *Clock, attemptTimeout time.Duration, idle int) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:          idle,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: clk.Real(attemptTimeout),
		DisableCompression:    true,
	}
}

// drain reads and closes a response so its connection can be reused.
func drain(resp *http.Response) {
	if resp != nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
}

func success(resp *http.Response, err error) bool {
	return err == nil && resp != nil && resp.StatusCode/100 == 2
}
