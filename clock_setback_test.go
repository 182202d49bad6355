package idemretry_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

// A clock set back 2 h with a 1 h window and a file journal that has seen the
// later time: a key minted now is aged from its minting, not judged by the
// journal's later time, so a new action is sent, not refused.
func TestSetBackDoesNotRefuseNewActions(t *testing.T) {
	clk := newFakeClock()
	sent := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) { sent++; return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithKeyWindow(time.Hour), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	r, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), "http://pay.example/", "a"))
	require.NoError(t, err)
	r.Body.Close()

	clk.Advance(-2 * time.Hour) // NTP steps the clock back 2 h
	ctx := idemretry.WithAction(context.Background(), "pay:new")
	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "b"))
	if err == nil {
		r.Body.Close()
	}
	require.NoError(t, err, "a brand-new action was refused (sent=%d)", sent)
}

// The same with the default window and a set-back of 23h59m: a new action
// keeps its whole window for its retries.
func TestSetBackDoesNotShrinkNewWindows(t *testing.T) {
	clk := newFakeClock()
	n := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		n++
		if n == 2 {
			return resp(503, r), nil
		}
		return resp(201, r), nil
	})
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithMaxRetries(3), idemretry.WithBackOff(constant(2*time.Minute)))
	require.NoError(t, err)
	defer tr.Close()
	r, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), "http://pay.example/", "a"))
	require.NoError(t, err)
	r.Body.Close()
	clk.Advance(-(23*time.Hour + 59*time.Minute))
	r, err = tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:new"), "http://pay.example/", "b"))
	if err == nil {
		r.Body.Close()
	}
	require.NoError(t, err, "a new action with a 503 became outcome-unknown after one 2-min wait")
}

// A never-sent action is never left outcome-unknown by a set-back, nor
// reported as maybe processed.
func TestSetBackNeverPoisonsNeverSentAction(t *testing.T) {
	clk := newFakeClock()
	sent := 0
	base := rtFunc(func(r *http.Request) (*http.Response, error) { sent++; return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournalDir(t.TempDir()),
		idemretry.WithClock(clk), idemretry.WithKeyWindow(time.Hour), idemretry.WithMaxRetries(0))
	require.NoError(t, err)
	defer tr.Close()
	r, err := tr.RoundTrip(post(t, idemretry.WithAction(context.Background(), "pay:1"), "http://pay.example/", "a"))
	require.NoError(t, err)
	r.Body.Close()
	clk.Advance(-2 * time.Hour)
	ctx := idemretry.WithAction(context.Background(), "pay:new")
	_, _ = tr.RoundTrip(post(t, ctx, "http://pay.example/", "b"))
	clk.Advance(3 * time.Hour) // clock past the mark again
	r, err = tr.RoundTrip(post(t, ctx, "http://pay.example/", "b"))
	if err == nil {
		r.Body.Close()
	}
	var ae *idemretry.ActionError
	if sent == 1 && errors.As(err, &ae) && ae.MaybeProcessed {
		t.Fatalf("never-sent action (attempts=%d) left StateUnknown and reported MaybeProcessed: %v", ae.Attempts, err)
	}
}
