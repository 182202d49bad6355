package idemretry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/idemretry/idemretry/journal"

	"github.com/stretchr/testify/require"

	"github.com/idemretry/idemretry"
)

type syncJournal struct {
	*journal.Memory
	sync func(ctx context.Context) error
}

func (j syncJournal) Sync(ctx context.Context) error { return j.sync(ctx) }

// finish Syncs a fingerprint-named action's "done" with the caller's
// cancellation stripped: a journal whose sync stalls (slow disk, NFS, a SQL
// journal) holds RoundTrip past the caller's deadline although the response
// is in hand.
func TestDoneSyncHonoursDeadline(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	j := syncJournal{journal.NewMemory(), func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-block:
			return nil
		}
	}}
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(newFakeClock()))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() {
		r, err := tr.RoundTrip(post(t, ctx, "http://pay.example/", "x"))
		if err == nil {
			r.Body.Close()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("RoundTrip still blocked in Sync 1.9 s after its context's deadline")
	}
}

// A failed Sync of a fingerprint-named "done" is dropped without a trace:
// not returned, not logged, although README promises the done is durable
// before RoundTrip returns.
func TestDoneSyncFailureLogged(t *testing.T) {
	var logs bytes.Buffer
	j := syncJournal{journal.NewMemory(), func(context.Context) error { return errors.New("injected EIO") }}
	base := rtFunc(func(r *http.Request) (*http.Response, error) { return resp(201, r), nil })
	tr, err := idemretry.NewTransport(base, idemretry.WithJournal(j), idemretry.WithClock(newFakeClock()),
		idemretry.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)
	r, err := tr.RoundTrip(post(t, context.Background(), "http://pay.example/", "x"))
	if err == nil {
		r.Body.Close()
	}
	require.True(t, err != nil || bytes.Contains(logs.Bytes(), []byte("EIO")), "sync failure neither returned nor logged; logs: %q", logs.String())
}
